"""Splitting an assistant token stream into its parts as the tokens arrive.

An answer is `[<think>\\n{reasoning}\\n</think>\\n][text]<tool_call>{json}</tool_call><|im_end|>`
with every part optional. `SegmentParser.feed(token)` returns the text deltas that token adds
(reasoning, plain text or call JSON), decoding UTF-8 incrementally so a character split over
byte-fallback tokens is emitted whole.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field

from ..formats.needle_wire import IM_END, THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from .events import DeltaEvent, ReasoningDelta, TextDelta, ToolCallDelta
from .stops import StopFilter

ANSWER, THINK, CALL, AFTER_CALL = "answer", "think", "call", "after_call"


@dataclass(frozen=True)
class MarkerIds:
    """Ids of the chat markers the generator acts on (each is a single token)."""

    think_open: int
    think_close: int
    tool_call_open: int
    tool_call_close: int
    im_end: int
    eos: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> MarkerIds:
        marker = tokenizer.marker_id
        return cls(
            think_open=marker(THINK_OPEN),
            think_close=marker(THINK_CLOSE),
            tool_call_open=marker(TOOL_CALL_OPEN),
            tool_call_close=marker(TOOL_CALL_CLOSE),
            im_end=marker(IM_END),
            eos=tokenizer.eos_id,
        )

    @property
    def stops(self) -> frozenset[int]:
        return frozenset((self.im_end, self.eos))


class LazyStrip:
    """Streams text with leading and trailing whitespace removed, without lookahead: leading
    whitespace is dropped, inner whitespace is held until non-whitespace follows it."""

    def __init__(self) -> None:
        self.started = False
        self.held = ""

    def feed(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body) :]
        return body


@dataclass
class SegmentParser:
    """Incremental splitter of one assistant turn. `strip_dummy_space` drops the one leading
    space the dummy prefix puts before an answer (as `Tokenizer.decode` does). `stops` are
    stop sequences for the plain answer text: once one appears, `stopped` is set and the text
    ends before it (reasoning and call JSON are not searched)."""

    token_bytes: list[bytes]
    markers: MarkerIds
    strip_dummy_space: bool = True
    mode: str = ANSWER
    reasoning: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    call: list[str] | None = None
    call_closed: bool = False
    stops: tuple[str, ...] = ()
    _first: bool = True

    def __post_init__(self) -> None:
        self._stop = StopFilter(self.stops) if self.stops else None
        self._new_segment()

    @property
    def stopped(self) -> bool:
        return self._stop is not None and self._stop.hit is not None

    def _new_segment(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = LazyStrip()

    def feed(self, token: int) -> list[DeltaEvent]:
        """Consume one token; return the deltas it completes."""
        first, self._first = self._first, False
        m = self.markers
        if token == m.think_open and self.mode == ANSWER:
            return self._switch(THINK)
        if token == m.think_close and self.mode == THINK:
            return self._switch(ANSWER)
        if token == m.tool_call_open and self.mode in (ANSWER, THINK):
            events = self._switch(CALL)
            self.call = []
            return events
        if token == m.tool_call_close and self.mode == CALL:
            self.call_closed = True
            return self._switch(AFTER_CALL)
        if token in m.stops:
            return self._switch(AFTER_CALL)
        data = self.token_bytes[token]
        if first and self.strip_dummy_space and data.startswith(b" "):
            data = data[1:]
        return self._emit(self._utf8.decode(data))

    def _switch(self, mode: str) -> list[DeltaEvent]:
        events = self._emit(self._utf8.decode(b"", final=True))
        if self.mode == ANSWER and self._stop is not None:
            events += self._text(self._stop.flush())  # a held tail that never became a stop
        self.mode = mode
        self._new_segment()
        return events

    def _emit(self, piece: str) -> list[DeltaEvent]:
        if not piece or self.mode == AFTER_CALL:
            return []
        if self.mode == CALL:
            # Call JSON is reported byte-exact: a parser downstream needs all of it.
            self.call.append(piece)
            return [ToolCallDelta(piece)]
        if self.mode == ANSWER and self._stop is not None:
            piece = self._stop.feed(piece)
        return self._text(piece)

    def _text(self, piece: str) -> list[DeltaEvent]:
        if not piece:
            return []
        piece = self._strip.feed(piece)
        if not piece:
            return []
        if self.mode == THINK:
            self.reasoning.append(piece)
            return [ReasoningDelta(piece)]
        self.text.append(piece)
        return [TextDelta(piece)]

    def finish(self) -> list[DeltaEvent]:
        """Flush a character cut off by the end of generation (and a held stop prefix)."""
        events = self._emit(self._utf8.decode(b"", final=True))
        if self.mode == ANSWER and self._stop is not None:
            events += self._text(self._stop.flush())
        return events

    @property
    def call_text(self) -> str | None:
        return None if self.call is None else "".join(self.call)
