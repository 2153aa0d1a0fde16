"""Probe heads: attention pooling over every (position, cell) pair (needle2 README "Probe
heads"; upstream `architecture.probe_pool`).

Cells per position are `[E[token] sqrt(C), lane mean after layer 0, ..., after layer L-1]`,
ordered position-major. Each probe scores every cell by `cell . probe / sqrt(C)`, softmaxes
over all of them and pools; the probes' pools are concatenated and projected.
"""

from __future__ import annotations

import numpy as np

from ..ops import softmax
from .weights import ProbeHead


def probe_pool(cells: np.ndarray, head: ProbeHead) -> np.ndarray:
    """Pooled features `[P*C]` for cells `[S, L+1, C]`."""
    width = cells.shape[-1]
    flat = cells.reshape(-1, width)
    scores = (flat @ head.probes.T) / np.sqrt(np.float32(width))  # [cells, P]
    weights = softmax(scores, axis=0)
    return (weights.T @ flat).reshape(-1)


def contrastive_embedding(cells: np.ndarray, head: ProbeHead) -> np.ndarray:
    """`proj pooled`, L2-normalised as `x / sqrt(sum x^2 + 1e-12)`."""
    out = probe_pool(cells, head) @ head.proj + head.bias
    return (out / np.sqrt(np.sum(np.square(out)) + np.float32(1e-12))).astype(np.float32)


def confidence_logit(cells: np.ndarray, head: ProbeHead) -> float:
    """`proj pooled + bias`, a logit (its sigmoid is the probability)."""
    return float((probe_pool(cells, head) @ head.proj + head.bias)[0])
