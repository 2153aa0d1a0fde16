"""Confidence probe head (fixture README step 7), pooled online.

Cells `C` [T, L+1, d]; for each cell row r and probe k:
`a = softmax_t(C[t,r].probes[r,k] / sqrt(d))`, `R[r,k] = rms_unit(sum_t a_t C[t,r]) * gain[r,k]`;
for each query q: `w = softmax_(r,k)(R[r,k].query[q] / sqrt(d) + row_bias[q,r,k])`,
`P_q = sum w R`; `logit = proj . concat_q(P_q) + bias`.

The softmax over t is kept as a running (max, normaliser, weighted sum) per (r, k), updated
chunk by chunk, so a session can report the confidence of everything it has consumed without
storing the cells or recomputing the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import rms_unit, softmax
from .weights import ConfidenceWeights

F32 = np.float32


@dataclass
class ConfidencePool:
    """Online softmax pooling state: peak/normaliser [cells, k], weighted sum [cells, k, d]."""

    peak: np.ndarray
    total: np.ndarray
    pooled: np.ndarray

    @classmethod
    def empty(cls, head: ConfidenceWeights) -> ConfidencePool:
        cells, probes, width = head.probes.shape
        return cls(
            np.full((cells, probes), -np.inf, F32),
            np.zeros((cells, probes), F32),
            np.zeros((cells, probes, width), F32),
        )

    def copy(self) -> ConfidencePool:
        return ConfidencePool(self.peak.copy(), self.total.copy(), self.pooled.copy())

    def update(self, head: ConfidenceWeights, cells: np.ndarray, first: int = 0) -> None:
        """Fold in the cells [C, R, d] of the next positions for cell rows `first .. first+R`.

        Each row's softmax over t is independent of the others, so a prefill chunk folds in
        one row per block as soon as it is computed (R = 1: no [C, L+1, d] cells array); the
        per-row products and sums are the same whatever R is."""
        width = cells.shape[-1]
        rows = slice(first, first + cells.shape[1])
        # scores[t, r, k] = C[t, r] . probes[r, k] / sqrt(d)
        probes = head.probes[rows]
        scores = (cells.transpose(1, 0, 2) @ probes.transpose(0, 2, 1)).transpose(1, 0, 2)
        scores = scores / np.sqrt(F32(width))
        old_peak = self.peak[rows]
        peak = np.maximum(old_peak, scores.max(axis=0))
        rescale = np.exp(old_peak - peak)
        weights = np.exp(scores - peak)  # [C, R, k]
        self.total[rows] = self.total[rows] * rescale + weights.sum(axis=0)
        # sum_t w[t, r, k] C[t, r] -> [R, k, d]
        added = weights.transpose(1, 2, 0) @ cells.transpose(1, 0, 2)
        self.pooled[rows] = self.pooled[rows] * rescale[:, :, None] + added
        self.peak[rows] = peak

    def logit(self, head: ConfidenceWeights) -> float:
        width = head.probes.shape[-1]
        pooled = self.pooled / self.total[:, :, None]
        rows = rms_unit(pooled) * head.gain[:, :, None]  # R [cells, k, d]
        flat = rows.reshape(-1, width)
        mixing = (head.query @ flat.T) / np.sqrt(F32(width))
        mixing = mixing + head.row_bias.reshape(head.query.shape[0], -1)
        pooled_queries = softmax(mixing, axis=-1) @ flat  # [q, d]
        return float((head.proj @ pooled_queries.reshape(-1) + head.bias)[0])
