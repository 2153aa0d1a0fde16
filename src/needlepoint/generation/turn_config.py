"""What one turn is decoded with: its options (`GenerationConfig`), what it needs from the
tokenizer (`TurnVocab`, computed once per tokenizer), and the grammar interfaces it masks
with (`Constraint`, `Matcher`). Apart from the turn loop (`turn.py`) so that the loop reads
as its steps.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidOptionError
from ..formats.needle_wire import TOOL_CALL_OPEN, continuation_ids, turn_prefix_ids
from .drafts import match_keys
from .logprobs import MAX_TOP_LOGPROBS
from .sampling import SamplingConfig
from .segments import MarkerIds, SegmentParser
from .stops import check_stops
from .text_markers import TextMarkerParser

NORMAL_TYPE, BYTE_TYPE = 0, 4  # tokenizer piece types that carry ordinary text


class Matcher(Protocol):
    """A grammar matcher started right after `<tool_call>`."""

    def allowed_mask(self) -> np.ndarray: ...

    def advance(self, token_id: int) -> Any: ...

    def is_finished(self) -> bool: ...


class Constraint(Protocol):
    """Something that can start a fresh matcher for one tool call (e.g. a compiled grammar)."""

    def start(self) -> Matcher: ...


@dataclass(frozen=True)
class GenerationConfig:
    """Per-turn decoding options.

    `reasoning_budget`: free-phase tokens allowed before `<tool_call>` is forced (None: no
    budget; 0: force the call at once). `require_call`: forbid ending the turn without a call.
    `allow_call=False`: no tool call at all (text only). `stop`: up to 4 stop sequences for
    the answer text. `logprobs`: None, or how many alternatives (0-20) to report with each
    answer-text token's log probability. `speculate`: verify prompt-lookup and grammar
    drafts in one pass where the session supports it exactly (`speculate.py`; the tokens
    are the same either way).
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 512
    reasoning_budget: int | None = 256
    require_call: bool = False
    allow_call: bool = True
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    speculate: bool = True
    call_threshold: float | None = None  # decline a call the model gives less (`route.py`)

    def __post_init__(self) -> None:
        if not isinstance(self.speculate, bool):
            raise InvalidOptionError(f"speculate must be true or false, got {self.speculate!r}")
        _count("max_new_tokens", self.max_new_tokens, 1)
        if self.reasoning_budget is not None:
            _count("reasoning_budget", self.reasoning_budget, 0, "or None (no budget)")
        object.__setattr__(self, "stop", check_stops(self.stop))
        if self.logprobs is not None:
            _count("logprobs", self.logprobs, 0, f"<= {MAX_TOP_LOGPROBS} (alternatives per "
                   "token), or None (off)", high=MAX_TOP_LOGPROBS)
        if self.require_call and not self.allow_call:
            raise InvalidOptionError("require_call and allow_call=False contradict each other")
        t = self.call_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real)
                              or not 0.0 <= t <= 1.0):
            raise InvalidOptionError(f"call_threshold must be a probability in [0, 1] or None, "
                                     f"got {t!r}")


def _count(name: str, value: Any, low: int, more: str = "", high: int | None = None) -> None:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        rule = f"an integer >= {low}" + (f" {more}" if more else "")
        raise InvalidOptionError(f"{name} must be {rule}, got {value!r}")


@dataclass(frozen=True)
class TurnVocab:
    """What the generator needs from the tokenizer, computed once per tokenizer."""

    token_bytes: list[bytes]
    markers: MarkerIds
    free_mask: np.ndarray  # bool[vocab]: tokens the free phase may emit
    call_prefix: tuple[int, ...]  # ids that open an answer with `<tool_call>` (dummy prefix)
    think_close_ids: tuple[int, ...]  # `\n</think>\n` as continuation ids
    match_keys: np.ndarray | None = None  # prompt-lookup match key per id (drafts.py)
    call_opening: tuple[int, ...] = ()  # `▁<tool_call>[{"name":"`: the opening draft
    # (open, close) when the call markers are text, not single tokens (`text_markers.py`):
    # the markers' ids above are then -1 and a whole-answer grammar decides calls
    text_markers: tuple[str, str] | None = None
    call_body: str = "list"  # "object": one call per marker pair (`text_markers.py`)
    call_start: np.ndarray | None = None  # bool[vocab]: tokens that begin the text marker
    fence_start: np.ndarray | None = None  # bool[vocab]: tokens that begin "```json" (route)
    closing: np.ndarray | None = None  # bool[vocab]: tokens that close a call (text_markers)
    call_translator: Any = None  # call text to JSON (FunctionGemma; call_syntax.py)
    # bool[vocab]: tokens that spell part of a single-token call marker (marker_tokens.py)
    marker_pieces: np.ndarray | None = None
    # the call markers' own tokens (open, close) when they are single tokens, -1 if not, and
    # the tokens that begin another call (marker_tokens.py)
    call_marker_ids: tuple[int, int] = (-1, -1)
    call_starts: np.ndarray | None = None

    def parser(self, stops: tuple[str, ...]) -> SegmentParser:
        """A fresh splitter of one answer's tokens."""
        if self.text_markers is None:
            return SegmentParser(self.token_bytes, self.markers, stops=stops)
        return TextMarkerParser(self.token_bytes, self.markers, strip_dummy_space=False,
                                stops=stops, call_open=self.text_markers[0],
                                call_close=self.text_markers[1], body=self.call_body,
                                translator=self.call_translator)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TurnVocab:
        markers = MarkerIds.from_tokenizer(tokenizer)
        types = np.asarray(tokenizer.types)
        free = (types == NORMAL_TYPE) | (types == BYTE_TYPE)
        for token in (markers.think_open, markers.think_close, markers.tool_call_open,
                      markers.im_end, markers.eos):
            free[token] = True
        return cls(
            token_bytes=tokenizer.all_token_bytes(),
            markers=markers,
            free_mask=free,
            call_prefix=tuple(turn_prefix_ids(tokenizer, TOOL_CALL_OPEN)),
            think_close_ids=tuple(continuation_ids(tokenizer, "\n</think>\n")),
            match_keys=match_keys(tokenizer.all_token_bytes()),
            call_opening=tuple(turn_prefix_ids(tokenizer, TOOL_CALL_OPEN + '[{"name":"')),
        )
