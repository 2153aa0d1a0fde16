"""Confidence hand-off: a bigger model answers when the local one is unsure.

    needle = Needle(tools, handoff=Handoff("http://big:8000/v1", "big-model",
                                           api_key_env="BIG_API_KEY", below=0.7))

After a turn, `Handoff.reason` says whether to hand it off: its confidence (the envelope's
`confidence`: the head's, else the token measure, `envelope.py`) is below `below`
("low_confidence"), the
answer was cut at `max_new_tokens` ("cut"), or no valid call fit the grammar ("no_valid_call":
a malformed or invalid call). Then the same conversation (OpenAI messages) and tools go to the
OpenAI-compatible `base_url` (`POST {base_url}/chat/completions`), and its answer replaces
the local one, marked `handoff: {"reason", "confidence", "model"}`. An endpoint that fails or
does not answer within `timeout` leaves the local answer, marked with the reason and the
`error` (never an exception). The key is read from the environment variable `api_key_env` at
each request and never logged or put in an error message.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidOptionError

DEFAULT_TIMEOUT_S = 60.0
ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class Handoff:
    """Where unsure answers go: an OpenAI-compatible endpoint (`base_url` ends before
    `/chat/completions`, e.g. `http://host:8000/v1`) and its `model`."""

    base_url: str
    model: str
    api_key_env: str | None = None
    below: float = 0.7
    timeout: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or \
                not self.base_url.startswith(("http://", "https://")):
            raise InvalidOptionError(f"handoff base_url must be an http(s) URL, got "
                                     f"{self.base_url!r}")
        if not isinstance(self.model, str) or not self.model:
            raise InvalidOptionError("handoff model must be a non-empty string")
        below = self.below
        if isinstance(below, bool) or not isinstance(below, int | float) or not 0 <= below <= 1:
            raise InvalidOptionError(f"handoff below must be a number in [0, 1], got {below!r}")
        if not isinstance(self.timeout, int | float) or not self.timeout > 0:
            raise InvalidOptionError(f"handoff timeout must be > 0 seconds, got "
                                     f"{self.timeout!r}")

    def reason(self, envelope: Mapping[str, Any]) -> str | None:
        """Why `envelope` should be handed off, or None to keep it."""
        if envelope.get("stop_reason") == "length":
            return "cut"
        if envelope.get("type") == "invalid" or "error" in envelope:
            return "no_valid_call"
        confidence = envelope.get("confidence")
        if confidence is not None and confidence < self.below:
            return "low_confidence"
        return None

    def review(self, envelope: dict[str, Any], messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]], options: Mapping[str, Any] | None = None
               ) -> dict[str, Any]:
        """`envelope`, or the endpoint's answer to `messages` with `tools` when it should be
        handed off (see the module doc)."""
        reason = self.reason(envelope)
        if reason is None:
            return envelope
        mark = {"reason": reason, "confidence": envelope.get("confidence"),
                "model": self.model}
        start = time.perf_counter()
        try:
            reply = self.ask(messages, tools, options or {})
        except HandoffFailed as failed:
            return {**envelope, "handoff": {**mark, "error": str(failed), "answered": False}}
        remote = remote_envelope(reply)
        remote["timings"] = {**envelope.get("timings", {}),
                             "handoff_s": time.perf_counter() - start}
        remote["handoff"] = {**mark, "answered": True}
        return remote

    def ask(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
            options: Mapping[str, Any]) -> dict[str, Any]:
        """One chat completion from the endpoint (HandoffFailed on any failure)."""
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if tools:
            body["tools"] = [{"type": "function", "function": dict(t)} for t in tools]
        for key in ("temperature", "top_p", "seed"):
            if options.get(key) is not None:
                body[key] = options[key]
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(f"{self.base_url.rstrip('/')}/chat/completions",
                                         data=json.dumps(body).encode(), headers=headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read()[:ERROR_BODY_CHARS].decode("utf-8", "replace")
            raise HandoffFailed(f"the endpoint answered HTTP {error.code}: {detail}") from None
        except (TimeoutError, urllib.error.URLError, OSError) as error:
            raise HandoffFailed(f"the endpoint did not answer: {_reason(error)}") from None
        except ValueError:
            raise HandoffFailed("the endpoint's answer is not JSON") from None
        if not isinstance(reply, dict) or not reply.get("choices"):
            raise HandoffFailed("the endpoint's answer has no choices")
        return reply


class HandoffFailed(Exception):
    """The hand-off endpoint failed (internal: the local answer is kept)."""


def _reason(error: BaseException) -> str:
    inner = getattr(error, "reason", None)
    return str(inner if inner is not None else error) or type(error).__name__


def remote_envelope(reply: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion as an envelope (the endpoint's calls, or its text)."""
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = {}
        calls.append({"name": function.get("name", ""),
                      "arguments": parsed if isinstance(parsed, dict) else {}})
    usage = reply.get("usage") or {}
    return {"type": "call" if calls else "respond", "function_calls": calls,
            "text": "" if calls else (message.get("content") or ""),
            "reasoning": message.get("reasoning_content") or "",
            "confidence": None, "confidence_source": None,  # the local one: handoff
            "stop_reason": "length" if choice.get("finish_reason") == "length" else "end",
            "usage": {"prompt_tokens": usage.get("prompt_tokens", 0),
                      "completion_tokens": usage.get("completion_tokens", 0)}}
