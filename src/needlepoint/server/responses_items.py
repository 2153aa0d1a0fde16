"""The objects of the Responses API: the response, its output items and its
stream events, as plain dicts in OpenAI's documented shapes; and the bounded in-memory store
of finished responses that `previous_response_id` reads.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

DEFAULT_STORED_RESPONSES = 1024


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def response_object(rid: str, req: Any, model: str, *, status: str, output: list[dict],
                    usage: dict[str, Any] | None = None, created: int | None = None,
                    incomplete: str | None = None, extra: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """A `response` object (the fields the official clients read, with the request's
    settings echoed back)."""
    return {
        "id": rid, "object": "response", "created_at": created or int(time.time()),
        "status": status, "model": model, "output": output,
        "error": None,
        "incomplete_details": None if incomplete is None else {"reason": incomplete},
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {}, "parallel_tool_calls": req.parallel_tool_calls
        is not False, "previous_response_id": req.previous_response_id,
        "temperature": req.temperature if req.temperature is not None else 0.0,
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [], "text": req.text or {"format": {"type": "text"}},
        "truncation": "disabled", "store": req.store is not False,
        "usage": usage, **(extra or {}),
    }


def usage_object(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [output_text(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


class EventCounter:
    """Stamps each stream event with its `sequence_number`."""

    def __init__(self) -> None:
        self.number = 0

    def __call__(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return event


class ResponseStore:
    """Finished responses by id, oldest dropped past `capacity` (thread-safe): each keeps the
    chat messages of its whole conversation (without `instructions`) and its output items."""

    def __init__(self, capacity: int = DEFAULT_STORED_RESPONSES) -> None:
        if capacity < 1:
            raise ValueError(f"the response store needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, messages: list[dict[str, Any]], response: dict[str, Any]) -> None:
        with self._lock:
            self._items[rid] = {"messages": messages, "response": response}
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, rid: str) -> dict[str, Any] | None:
        with self._lock:
            return self._items.get(rid)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
