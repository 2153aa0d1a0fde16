"""`tool_choice="auto"` on a template model: call or answer, as the model itself chooses.

The whole-answer grammar (`answer_grammar.py`) allows, at the answer's first token, both a
token that begins the template's call marker (`<tool_call>`) and plain text. The model's own
choice decides: the token the sampler picks from the grammar-allowed tokens (greedy: the most
likely), as llama.cpp's "lazy" grammar does (free until the call starts, the grammar from
there on). A token that begins a fenced JSON block (a prefix of "```json": "```", "```json")
counts as the model choosing to call, since with tools offered that is how a model that does
not use its template's syntax writes a call (Qwen2.5-Coder writes ```json {"name": ...}```):
the call marker's first token is written instead, and the grammar writes the call in the
template's own syntax from there. A bare JSON object ("{") is not read as a call:
Qwen2.5-Coder-0.5B starts one for chit-chat too, with made-up tool names ("hello"), so its
first token does not tell a call from an answer (the next step: a lazy grammar triggered by
`{"name": "` followed by a declared tool's name).

`threshold` (`GenerationConfig.call_threshold`, default None: off) declines a weak call: when
the model chose to call but gave the call side (marker and fence starts) less than
`threshold` of the allowed mass, the answer is text instead. The route's probability is the
first decision of the answer's confidence (`decisions.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .decisions import route_probability

FENCE = b"```json"


def fence_start_mask(token_bytes: list[bytes]) -> np.ndarray:
    """bool[vocab]: tokens that begin a fenced JSON block: they start with three backticks
    and are a prefix of "```json" or start with it."""
    return np.array([b.startswith(b"```") and (FENCE.startswith(b) or b.startswith(FENCE))
                     for b in token_bytes], bool)


def route(logits: np.ndarray, allowed: np.ndarray, call_start: np.ndarray,
          fence: np.ndarray | None, threshold: float | None,
          choose: Callable[[np.ndarray], int]) -> tuple[int, float | None]:
    """(token, route probability) of the answer's first token. `choose(mask)` is the
    sampler over a mask; the probability is None when only one side was allowed."""
    side = call_start if fence is None else call_start | fence[: call_start.shape[0]]
    token = choose(allowed)
    if not (allowed & call_start).any():
        return token, None  # no call possible here
    p_call = route_probability(logits, allowed, side, side.nonzero()[0][0]) \
        if side.any() else None
    if p_call is None:
        return token, None
    if side[token]:
        if threshold is not None and p_call < threshold:
            return choose(allowed & ~side), 1.0 - p_call  # a weak call declined: text
        if not call_start[token]:
            return choose(allowed & call_start), p_call  # a fence: the template's marker
        return token, p_call
    return token, 1.0 - p_call


__all__ = ["FENCE", "fence_start_mask", "route"]
