"""One decoded assistant turn, as the generator hands it over (`TurnComplete`, `events.py`)
before the API builds an envelope from it. A module of its own, with no imports from the
generation layer, so that the events and the turn loop both use it without an import circle
.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TurnResult:
    """One decoded assistant turn."""

    tokens: list[int]  # every generated or forced token, stop token included
    reasoning: str
    text: str
    call_text: str | None  # JSON between `<tool_call>` and `</tool_call>`, None if no call
    call_closed: bool
    # "end" (im_end / grammar done), "eos", "length", "stop" (sequence), "repeat" (a call
    # identical to an earlier one was finished: the answer is the calls before it)
    stop_reason: str
    call_token_probs: list[float]
    forced_call: bool
    seed: int
    prefill_tokens: int
    prefill_s: float
    decode_s: float
    pending: list[int]  # tokens generated but not yet fed to the session
    logprobs: list[dict[str, Any]] | None = None  # per answer-text token, when requested
    first_token_prob: float | None = None  # first sampled token, unmasked (api/envelope.py)
    # forward passes after the prefill, and the drafts per source (`speculate.py`):
    # {"decode_passes", "lookup_drafted", "lookup_accepted", "grammar_drafted", ...}
    speculation: dict[str, int] = field(default_factory=dict)
    # the decisions the model made (`decisions.Decision`): the confidence's evidence
    decisions: list[Any] = field(default_factory=list)

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens)

    @property
    def decode_passes(self) -> int:
        return self.speculation.get("decode_passes", 0)
