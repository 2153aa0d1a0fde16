"""A `Needle`'s chat and what decodes it (an object of its own, not `Needle`'s private fields).

`ChatState` holds the `Chat` (`chat.py`: the messages, the one record of the conversation,
which the hand-off is sent and the model's chat format renders), the `Conversation` decoding it
(session and token history), the tools and grammar it offers (fixed by its first query: the
model only ever saw those schemas), and how many of the oldest exchanges no longer fit the
context (Needle's wire format replays the rest: `context.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..formats.chat_format import NeedleFormat
from ..generation.grammar import ToolCallGrammar
from .chat import Chat, Exchange
from .conversation import Conversation
from .tools import ToolSpec


@dataclass
class ChatState:
    """One chat's state; `conversation` is None until the first query (and after `reset`)."""

    conversation: Conversation | None = None
    specs: list[ToolSpec] = field(default_factory=list)  # the tools this chat offers
    grammar: ToolCallGrammar | None = None  # their call grammar
    chat: Chat = field(default_factory=Chat)
    dropped: int = 0  # the oldest exchanges left out of the conversation's context

    def start(self, conversation: Conversation, specs: list[ToolSpec],
              grammar: ToolCallGrammar | None, system: str, query: str) -> None:
        """A new chat opened by `query` after the system text `system`, offering `specs`."""
        self.conversation = conversation
        self.specs, self.grammar = specs, grammar
        self.chat = Chat.opened(system, query)
        self.dropped = 0

    def reset(self) -> None:
        """Forget the chat (the next turn starts a new one)."""
        self.conversation = None
        self.chat = Chat()
        self.dropped = 0

    def kept(self, fmt: NeedleFormat) -> tuple[list[Exchange], str]:
        """The exchanges still in the context, and the next user turn's content (`fmt`'s)."""
        exchanges, content = self.chat.exchanges(fmt)
        return exchanges[self.dropped:], content

    def dropped_more(self, count: int, conversation: Conversation) -> None:
        """`count` more of the oldest exchanges were dropped; `conversation` replays the
        rest."""
        self.dropped += count
        self.conversation = conversation
