"""Splitting an assistant turn whose call markers are text, not single tokens.

A chat template's `<tool_call>`/`</tool_call>` (SmolLM2's tokenizer spells `<tool_call>` in five
pieces) is found in the decoded text, as vLLM's tool parsers find it: text that could still
become a marker is held back until it does (or cannot), so a streamed answer never shows half
a marker and the call JSON between the markers is reported byte-exact as `ToolCallDelta`s.
Same interface and events as `segments.SegmentParser` (there is no think block).

`body="list"`: one `<tool_call>[...]</tool_call>` block holds the JSON list of calls (the
Hermes-style prompt's). `body="object"`: one call object per block, blocks one after another
(what templates that render tools ask for); the parser reports them as one JSON list (`[`
before the first, `,` between, `]` at the end), so `call_text` is a list either way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .events import DeltaEvent, ToolCallDelta
from .segments import AFTER_CALL, ANSWER, CALL, THINK, SegmentParser


def call_start_mask(token_bytes: list[bytes], marker: str) -> np.ndarray:
    """bool[vocab]: the tokens that begin `marker` (their bytes are a prefix of it)."""
    data = marker.encode("utf-8")
    return np.array([bool(b) and data.startswith(b) for b in token_bytes], bool)


def explicit_choice(allowed: np.ndarray, logits: np.ndarray, call_start: np.ndarray,
                    threshold: float) -> np.ndarray:
    """`tool_choice="auto"`'s first token, decided explicitly: a call when the model gives
    the tokens that begin the call marker at least `threshold` probability (of all its
    unmasked mass), else text. `allowed` is returned unchanged when only one is possible."""
    starts = allowed & call_start
    text = allowed & ~call_start
    if not starts.any() or not text.any():
        return allowed
    shifted = np.exp(logits - logits.max())
    p_call = float(shifted[starts].sum() / shifted.sum())
    return starts if p_call >= threshold else text


CLOSE_RESERVE = 64  # tokens kept to close a call the token budget would otherwise cut off
# What closes a call, most closing first: the end of a string, object or list; a comma (only
# when a required key must still come); the closing marker's characters.
CLOSING_TIERS = (b'"}]', b'"}],', b'"}],</> ')


def closing_mask(token_bytes: list[bytes], marker: str = "") -> np.ndarray:
    """bool[tiers, vocab]: per tier of `CLOSING_TIERS`, the tokens made only of its
    characters; the last tier also takes the characters of `marker` (what closes a call in
    a template's layout, e.g. Qwen's `\n</tool_call>` or `<end_function_call>`)."""
    tiers = [*CLOSING_TIERS[:-1], CLOSING_TIERS[-1] + marker.encode("utf-8")]
    return np.array([[bool(b) and all(c in chars for c in b) for b in token_bytes]
                     for chars in tiers], bool)


def close_reserve(budget: int | None) -> int:
    """The tokens kept to close a call: `CLOSE_RESERVE`, at most a quarter of a small
    `budget` (max_new_tokens)."""
    return CLOSE_RESERVE if budget is None else min(CLOSE_RESERVE, budget // 4)


def close_when_short(allowed: np.ndarray, closing: np.ndarray, remaining: int,
                     budget: int | None = None) -> np.ndarray:
    """Near the end of the token budget inside a call, only what closes it: a token that
    ends a JSON value when the grammar allows one (so a list of calls ends rather than taking
    one more), else a comma, else one that spells the closing marker, else whatever the
    grammar allows (a forced key). So a call running away (a string that never ends, the
    same call again and again) is closed instead of being cut off unparseable. The reserve is
    `CLOSE_RESERVE` tokens, at most a quarter of a small `budget` (max_new_tokens)."""
    if remaining > close_reserve(budget):
        return allowed
    for tier in closing:
        narrowed = allowed & tier
        if narrowed.any():
            return narrowed
    return allowed


def end_when_short(allowed: np.ndarray, ends: Iterable[int], remaining: int,
                   budget: int | None = None, block: int = 0) -> np.ndarray:
    """Between call blocks (one call object per marker pair: Qwen, FunctionGemma), when
    another block like the longest so far (`block` tokens, markers included) would leave
    less than the closing reserve of `close_when_short`: only the end of the turn, when the
    grammar allows it. So the answer ends with the calls it has instead of opening one more
    block that the budget cuts off unparseable (a looping model calling the same tool again
    and again, as qwen3-tiny's own weights do). Inside a block `close_when_short`
    cannot shorten what the grammar forces (a name, a key), hence a whole block's room."""
    if remaining > close_reserve(budget) + block:
        return allowed
    narrowed = np.zeros_like(allowed)
    ids = [t for t in ends if 0 <= t < len(allowed)]
    narrowed[ids] = allowed[ids]
    return narrowed if narrowed.any() else allowed


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


@dataclass
class TextMarkerParser(SegmentParser):
    """`SegmentParser` for markers matched as text (`call_open`, `call_close`)."""

    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    body: str = "list"
    # a factory of streaming translators of one call's text to its JSON object (FunctionGemma's
    # `call:NAME{...}`, `syntax_functiongemma.py`), None when the call text is JSON already
    translator: Any = None
    _held: str = ""
    _translating: Any = None

    def _searching(self) -> bool:
        return self.mode in (ANSWER, CALL) or (self.mode == AFTER_CALL and self.body ==
                                                "object" and self.call is not None)

    def feed(self, token: int) -> list[DeltaEvent]:
        self._first = False
        if token in self.markers.stops:
            return self._flush_held() + self._switch(AFTER_CALL)
        if token == self.markers.think_open and self.mode == ANSWER and self.call is None:
            return self._flush_held() + self._switch(THINK)  # a thinking template's reasoning
        if token == self.markers.think_close and self.mode == THINK:
            return self._switch(ANSWER)
        return self._scan(self._utf8.decode(self.token_bytes[token]))

    def _scan(self, text: str) -> list[DeltaEvent]:
        events: list[DeltaEvent] = []
        buffer = self._held + text
        self._held = ""
        if self.mode == THINK:
            return self._emit(buffer)
        while self._searching():
            marker = self.call_close if self.mode == CALL else self.call_open
            index = buffer.find(marker)
            if index < 0:
                keep = held_prefix(buffer, marker)
                events += self._emit(buffer[: len(buffer) - keep])
                self._held = buffer[len(buffer) - keep :]
                return events
            events += self._emit(buffer[:index])
            buffer = buffer[index + len(marker) :]
            if self.mode != CALL:
                again = self.call is not None
                events += self._switch(CALL)
                self.call = self.call if again else []
                self.call_closed = False
                if self.body == "object":
                    events += super()._emit("," if again else "[")
            else:
                events += self._close_translation()
                self.call_closed = True
                events += self._switch(AFTER_CALL)
        return events

    def _emit(self, piece: str) -> list[DeltaEvent]:
        if self.mode == CALL and self.translator is not None and piece:
            if self._translating is None:
                self._translating = self.translator()
            piece = self._translating.feed(piece)
        return super()._emit(piece)

    def _close_translation(self) -> list[DeltaEvent]:
        done, self._translating = self._translating, None
        return super()._emit(done.finish()) if done is not None else []

    def _flush_held(self) -> list[DeltaEvent]:
        held, self._held = self._held, ""
        return self._emit(held) if held else []

    def finish(self) -> list[DeltaEvent]:
        events = self._flush_held() + super().finish()
        if self._translating is not None:  # a call cut off: what it had, as it stands
            self.mode, mode = CALL, self.mode
            events += self._close_translation()
            self.mode = mode
        if self.body == "object" and self.call is not None:
            self.call.append("]")
            events.append(ToolCallDelta("]"))
        return events
