"""Per-token log probabilities of an answer (OpenAI `logprobs` / `top_logprobs`).

From the model's own unmasked distribution at temperature 1 (log-softmax of the raw logits),
as the call confidence uses: a token the grammar or the sampler forced shows the model's
view of it, not a renormalised one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


def _piece(data: bytes) -> dict[str, Any]:
    return {"token": data.decode("utf-8", errors="replace"), "bytes": list(data)}


def token_logprob(logits: np.ndarray, token: int, token_bytes: list[bytes], top: int,
                  leading: bool) -> dict[str, Any]:
    """The entry of `token` chosen from `logits`, with the `top` most likely alternatives.
    `leading`: no answer text has been written yet, so leading whitespace (the dummy-prefix
    space, blank lines) is not part of the text, as the answer is reported stripped."""
    x = np.asarray(logits, dtype=np.float64)
    n = min(x.shape[0], len(token_bytes))  # LM-head rows past the vocabulary are not tokens
    x = x[:n]
    peak = float(np.max(x))
    logz = peak + float(np.log(np.sum(np.exp(x - peak))))

    def text(tid: int) -> bytes:
        data = token_bytes[tid]
        return data.lstrip() if leading else data

    entry = {**_piece(text(token)), "logprob": float(x[token] - logz)}
    alternatives = []
    if top > 0:
        best = np.argpartition(-x, min(top, n - 1))[:top] if top < n else np.arange(n)
        best = sorted(best.tolist(), key=lambda t: (-x[t], t))
        alternatives = [{**_piece(text(t)), "logprob": float(x[t] - logz)} for t in best]
    entry["top_logprobs"] = alternatives
    return entry
