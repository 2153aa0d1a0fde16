"""Streaming events, produced while tokens are decoded (not after the turn ends).

A turn streams `ReasoningDelta`s (text inside `<think>...</think>`), `TextDelta`s (a plain
answer outside any tool call), `ToolCallDelta`s (the JSON text between `<tool_call>` and
`</tool_call>`, exactly as generated), then one closing event: `TurnComplete` from the
generator (carrying the raw `TurnResult`), which the API turns into `Done` (carrying the
envelope dict). Deltas are whitespace-trimmed at both ends of each segment, so joining a
kind's deltas gives exactly that field of the final envelope. With `logprobs` requested,
each answer-text token is followed by a `LogprobDelta`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .turn_result import TurnResult


@dataclass(frozen=True)
class _Delta:
    """A piece of streamed text; the subclass says which kind (its `type`)."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta(_Delta):
    type: ClassVar[str] = "reasoning"


@dataclass(frozen=True)
class TextDelta(_Delta):
    type: ClassVar[str] = "text"


@dataclass(frozen=True)
class ToolCallDelta(_Delta):
    type: ClassVar[str] = "tool_call"


@dataclass(frozen=True)
class LogprobDelta:
    """The log probability of one answer-text token, when `GenerationConfig.logprobs` is set:
    `entry` is `{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
    "bytes"}, ...]}` (OpenAI's shape), from the model's unmasked distribution at T = 1.
    Streamed right after the token's `TextDelta` (if it made one)."""

    entry: dict[str, Any]
    type: ClassVar[str] = "logprob"

    @property
    def text(self) -> str:  # no text of its own: a consumer joining texts adds nothing
        return ""


@dataclass(frozen=True)
class TurnComplete:
    """The generator's last event: the decoded turn, before any envelope is built."""

    result: TurnResult
    type: ClassVar[str] = "turn_complete"


@dataclass(frozen=True)
class Done:
    """The API's last event: the final envelope (same dict `complete` returns)."""

    envelope: dict[str, Any] = field(default_factory=dict)
    type: ClassVar[str] = "done"


DeltaEvent = ReasoningDelta | TextDelta | ToolCallDelta
