"""A `Needle`'s chat: the conversation it continues, and what it remembers of it (an object
of its own, not `Needle`'s private fields).

`ChatHistory` holds the current `Conversation` (session and token history), the tools and
grammar it offers (fixed by its first query: the model only ever saw those schemas), the
finished exchanges (`history.Turn`, replayed when old turns are dropped to fit the context),
and, for a template model, the messages so far in OpenAI's shape (its chat template renders
them whole at every turn: `template_chat.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..generation.grammar import ToolCallGrammar
from .conversation import Conversation
from .history import Turn
from .tools import ToolSpec


def assistant_message(envelope: dict[str, Any]) -> dict[str, Any]:
    """The assistant message a finished turn adds to the history."""
    calls = envelope.get("function_calls") or None
    return {"role": "assistant", "content": envelope.get("text", ""), "tool_calls": calls}


def tool_messages(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`[{"name", "result" | "error"}]` as `tool` messages."""
    return [{"role": "tool", "name": r.get("name", ""),
             "content": r["result"] if "result" in r else {"error": r.get("error")}}
            for r in results]


@dataclass
class ChatHistory:
    """One chat's state; `conversation` is None until the first query (and after `reset`)."""

    conversation: Conversation | None = None
    specs: list[ToolSpec] = field(default_factory=list)  # the tools this chat offers
    grammar: ToolCallGrammar | None = None  # their call grammar
    turns: list[Turn] = field(default_factory=list)  # finished exchanges, oldest first
    messages: list[dict[str, Any]] = field(default_factory=list)  # a template model's

    def start(self, conversation: Conversation, specs: list[ToolSpec],
              grammar: ToolCallGrammar | None, query: str) -> None:
        """A new chat opened by `query`, offering `specs`."""
        self.conversation = conversation
        self.specs, self.grammar = specs, grammar
        self.turns = []
        self.messages = [{"role": "user", "content": query}]

    def reset(self) -> None:
        """Forget the chat (the next turn starts a new one)."""
        self.conversation = None
        self.turns = []

    def answered(self, envelope: dict[str, Any]) -> None:
        """A turn's envelope is final: a template model's history gains the answer."""
        self.messages.append(assistant_message(envelope))

    def finished(self, user: str, answer: Sequence[int]) -> None:
        """An exchange is over: `user`'s text and the answer's tokens (for replays)."""
        self.turns.append(Turn(user, list(answer)))

    def dropped(self, count: int, conversation: Conversation) -> None:
        """The oldest `count` exchanges were dropped; `conversation` replays the rest."""
        self.turns = self.turns[count:]
        self.conversation = conversation

    def template_messages(self, system: str) -> list[dict[str, Any]]:
        """The messages a chat template renders: the system text, then the chat's."""
        return ([{"role": "system", "content": system}] if system else []) + self.messages
