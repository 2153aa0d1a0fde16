"""One chat, kept once: OpenAI-style messages (the chat formats' shape, `formats/chat_format.py`).

`Chat.messages` is the single record of a conversation: `Needle` appends to it as it goes
(`chat_state.ChatState`), the server builds one from a request's messages
(`server/client_chat.py`), and everything else is a view of it:

* what a model is shown: its chat format renders the messages (`Needle.chat_ids`);
* the exchanges Needle's wire format replays when old ones are dropped to fit the context
  (`exchanges`: each user turn's content and the answer's tokens, exactly as generated when
  this process generated them);
* what a hand-off endpoint is sent (`openai_messages`: OpenAI's wire shape, with call ids and
  arguments as JSON text).

Messages: `{"role": "system" | "user", "content": str}` (a system message comes first, if
any), `{"role": "assistant", "content": str, "tool_calls": [{"name", "arguments"}] | None}`,
`{"role": "tool", "name": str, "content": result}` (a failed call's result is
`{"error": message}`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..formats.chat_format import NeedleFormat, tool_results

__all__ = ["Chat", "Exchange", "assistant_message", "tool_messages"]


def assistant_message(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message a finished turn adds to a chat."""
    calls = envelope.get("function_calls") or None
    return {"role": "assistant", "content": envelope.get("text", ""), "tool_calls": calls}


def tool_messages(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`[{"name", "result" | "error"}]` as `tool` messages."""
    return [{"role": "tool", "name": r.get("name", ""),
             "content": r["result"] if "result" in r else {"error": r.get("error")}}
            for r in results]


@dataclass
class Exchange:
    """One finished exchange of a chat: the user turn's content (its text, the format's
    tool-results text, or both) and the answer's tokens."""

    user: str
    answer: list[int]


@dataclass
class Chat:
    """One chat as OpenAI-style messages (see the module doc). `tokens` maps the index of an
    assistant message this process generated to its tokens, stop token included."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def opened(cls, system: str, query: str) -> Chat:
        """A chat of a system text (none when empty) and a first user message."""
        head = [{"role": "system", "content": system}] if system else []
        return cls([*head, {"role": "user", "content": query}])

    # -- reading ---------------------------------------------------------------------------
    @property
    def system(self) -> str:
        """The system text ("" without a system message)."""
        return "\n".join(str(m.get("content") or "") for m in self.messages
                         if m["role"] == "system")

    @property
    def turns(self) -> list[dict[str, Any]]:
        """The messages after the system text: user, assistant and tool messages."""
        return [m for m in self.messages if m["role"] != "system"]

    @property
    def query(self) -> str:
        """The first user message's text (what tool retrieval ranks the tools against)."""
        return next(str(m["content"]) for m in self.messages if m["role"] == "user")

    @property
    def first_turn(self) -> bool:
        """No answer yet: the prompt is a first turn's."""
        return not any(m["role"] == "assistant" for m in self.messages)

    # -- adding ----------------------------------------------------------------------------
    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def add_tool_results(self, results: Sequence[Mapping[str, Any]]) -> None:
        """Results of the last answer's calls, `[{"name", "result" | "error"}]`."""
        self.messages.extend(tool_messages(results))

    def add_answer(self, envelope: Mapping[str, Any], tokens: Sequence[int] | None = None
                   ) -> None:
        """A finished turn's answer; `tokens`, when this process generated it."""
        self.messages.append(assistant_message(envelope))
        if tokens is not None:
            self.tokens[len(self.messages) - 1] = [int(t) for t in tokens]

    def replace_answer(self, envelope: Mapping[str, Any]) -> None:
        """The last answer becomes `envelope`'s (a hand-off's): what the user was given is
        what the chat holds, so every later turn is rendered from it."""
        last = len(self.messages) - 1
        if last < 0 or self.messages[last]["role"] != "assistant":
            raise ValueError("the chat does not end with an answer to replace")
        self.messages[last] = assistant_message(envelope)
        self.tokens.pop(last, None)

    def truncate(self, length: int) -> None:
        """Keep the first `length` messages (a failed turn's are taken back)."""
        del self.messages[length:]
        self.tokens = {k: v for k, v in self.tokens.items() if k < length}

    # -- views -----------------------------------------------------------------------------
    @property
    def answer_generated(self) -> bool:
        """Whether the last answer's tokens are the ones generated here (not a hand-off's)."""
        last = max((k for k, m in enumerate(self.messages) if m["role"] == "assistant"),
                   default=None)
        return last is not None and last in self.tokens

    def exchanges(self, fmt: NeedleFormat) -> tuple[list[Exchange], str]:
        """(the finished exchanges, oldest first; the content of the user turn after them,
        "" when the chat ends on an answer), as Needle's wire format `fmt` replays them: a
        user turn's content is its text, the tool results before it as `fmt` writes them, or
        both (tool results first, one per line); an answer is its tokens as generated, or,
        for one given from elsewhere (a hand-off's), its text encoded (`fmt.answer_ids`)."""
        out: list[Exchange] = []
        user: list[str] = []
        group: list[Mapping[str, Any]] = []

        def content() -> str:
            parts = [fmt.tool_results_content(tool_results(group))] if group else []
            group.clear()
            return "\n".join(parts + user)

        for index, message in enumerate(self.messages):
            role = message["role"]
            if role == "user":
                user.append(str(message["content"]))
            elif role == "tool":
                group.append(message)
            elif role == "assistant":
                tokens = self.tokens.get(index)
                out.append(Exchange(content(), fmt.answer_ids(message) if tokens is None
                                    else list(tokens)))
                user = []
        return out, content()

    def openai_messages(self, stop: int | None = None) -> list[dict[str, Any]]:
        """`messages[:stop]` in OpenAI's wire shape: calls with ids (`call_1`, ... in order)
        and arguments as JSON text, each tool message answering the call at its place after
        the assistant message (`tool_call_id`), contents as strings."""
        out: list[dict[str, Any]] = []
        ids: list[str] = []  # the call ids of the last assistant message
        made = answered = 0  # calls so far; tool messages since the last assistant message
        for message in self.messages[:stop]:
            role = message["role"]
            if role == "assistant" and message.get("tool_calls"):
                ids = [f"call_{made + k + 1}" for k in range(len(message["tool_calls"]))]
                made, answered = made + len(ids), 0
                out.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function",
                     "function": {"name": call["name"],
                                  "arguments": json.dumps(call.get("arguments", {}))}}
                    for call_id, call in zip(ids, message["tool_calls"], strict=True)]})
            elif role == "assistant":
                ids, answered = [], 0
                out.append({"role": "assistant", "content": message.get("content") or ""})
            elif role == "tool":
                value = message.get("content")
                if isinstance(value, dict) and set(value) == {"error"}:
                    value = value["error"]
                call_id = ids[answered] if answered < len(ids) else f"call_r{answered}"
                answered += 1
                out.append({"role": "tool", "tool_call_id": call_id,
                            "content": value if isinstance(value, str) else json.dumps(value)})
            else:
                out.append({"role": role, "content": message["content"]})
        return out
