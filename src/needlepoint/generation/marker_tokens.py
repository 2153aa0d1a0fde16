"""Between calls: the markers as the template's own tokens, and where another call is decided.

A template whose call markers are single added tokens (Qwen's `<tool_call>` and
`</tool_call>`) renders them as those tokens, never spelled in pieces. The grammar matches the
markers as text, so it also allows spellings like `<` `/tool` `_call` `>\\n`: a piece like
`>\\n` ends the closing marker *and* commits to another call, a choice the model never made
as such. Once the choice below is made, only the marker tokens themselves spell a marker
(`between_calls`). An auto answer (whose route chose to call) is decoded as before: the rule
was measured in forced mode only.

Where another call is decided (`close_choice`, for answers that must call: `tool_choice`
required or named). After a call's JSON closes, the grammar forces the closing marker, while
the model says there what it wants next: its end tokens, or another call object (`{"...`, the
way this kind of model writes calls on its own, or the open marker). Later positions do not
tell: a model that wants to end writes the separator after `</tool_call>` and its end token
only then, where the grammar allows only another `<tool_call>`. So when the model clearly
wants another call there (`MORE_AT`), or wants its end more than another call, that choice
is made at the marker: the marker is written as its own token, then the end of the turn or
`\\n<tool_call>`. Otherwise (another call likelier than the end, but not clearly; or the
closing marker itself likelier than both) the model decides after the marker as before,
marker pieces included: on BFCL live_* single calls look like that, and a rule that went on
whenever another call was likelier than the end added a second call to most of them
(docs/benchmarks_bfcl.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

END, MORE = "end", "more"
# Another call is decided at the closing marker only when the model wants it this clearly:
# on BFCL live_* (Qwen2.5-Coder-0.5B), the first call of a parallel answer gave another call
# object 0.86-0.99 there, single calls 0.51-0.79 (they decide after the marker, as before).
MORE_AT = 0.8


def marker_pieces(token_bytes: list[bytes], markers: Mapping[str, int]) -> np.ndarray | None:
    """bool[vocab]: the tokens other than the markers' own that end inside a marker's text
    (their bytes end with a non-empty prefix of it: `<`, `</`, `\\n<`, `</tool`); None when
    no marker is a single token."""
    if not markers:
        return None
    texts = [text.encode("utf-8") for text in markers]
    own = set(markers.values())
    mask = np.zeros(len(token_bytes), bool)
    firsts = {text[:1] for text in texts}
    for i, data in enumerate(token_bytes):
        if i in own or not any(first in data for first in firsts):
            continue
        mask[i] = any(data.endswith(text[:k]) for text in texts
                      for k in range(1, len(text) + 1))
    return mask


def call_starts(token_bytes: list[bytes], open_id: int) -> np.ndarray:
    """bool[vocab]: the tokens that begin another call: the open marker, and a JSON object's
    `{` after optional whitespace or a comma."""
    mask = np.array([b.lstrip(b" \t\r\n,").startswith(b"{") for b in token_bytes], bool)
    if open_id >= 0:
        mask[open_id] = True
    return mask


def between_calls(allowed: np.ndarray, pieces: np.ndarray) -> np.ndarray:
    """`allowed` without the marker pieces (unless nothing else is allowed)."""
    narrowed = allowed & ~pieces
    return narrowed if narrowed.any() else allowed


def close_choice(logits: np.ndarray, close_id: int, starts: np.ndarray,
                 stops: frozenset[int]) -> tuple[str | None, float]:
    """(END, MORE or None, the chosen side's share of the starts' and ends' mass) at the
    closing marker's position: MORE when another call's first tokens get at least
    `MORE_AT` of the model's probability, END when its end tokens get more than they do,
    None (the model decides after the marker, as before) otherwise, or when it gives the
    closing marker itself more than either."""
    x = np.asarray(logits, np.float64).reshape(-1)[: starts.shape[0]]
    e = np.exp(x - x.max())
    total = float(e.sum())
    more = float(e[starts].sum()) / total
    end = float(e[list(stops)].sum()) / total
    if float(e[close_id]) / total >= max(more, end) or more + end <= 0.0:
        return None, 1.0
    if more >= MORE_AT:
        return MORE, more / (more + end)
    if end > more:
        return END, end / (more + end)
    return None, 1.0


def after_close(allowed: np.ndarray, stops: frozenset[int], choice: str) -> np.ndarray:
    """The tokens after the closing marker that follow `choice`: an end token (END), or
    not (MORE: the separator, then the next call); `allowed` itself when that leaves none."""
    ends = np.zeros(allowed.shape[0], bool)
    ends[list(stops)] = True
    narrowed = allowed & (ends if choice == END else ~ends)
    return narrowed if narrowed.any() else allowed


__all__ = ["END", "MORE", "MORE_AT", "after_close", "between_calls", "call_starts", "close_choice",
           "marker_pieces"]
