"""Sums over the n mHC lanes (fixture README step 5), in the two orders the numerics use.

Deploy numerics (docs/numerics.md "Row sums and means") sum the lanes one by one in lane
order, elementwise, so a row's bits never depend on the batch (`lane_sum`, `lane_mean`,
`mix_lanes`); float numerics use numpy's batched matmuls and reductions (`matmul_lane_sum`,
`scatter`, `mean_cells`). `numerics.py` picks one set per model.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
# Positions per block of `scatter`'s in-place update: a block's new lanes are a small
# temporary, so a prefill chunk never holds two lanes-sized arrays at once.
SCATTER_BLOCK = 32


def lane_sum(weights: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """`sum_i weights[t, i] * lanes[t, i]` for weights [T, n] and lanes [T, n, d], i in order."""
    out = weights[:, 0, None] * lanes[:, 0]
    for lane in range(1, lanes.shape[1]):
        out += weights[:, lane, None] * lanes[:, lane]
    return out


def lane_mean(lanes: np.ndarray) -> np.ndarray:
    """Mean over the lanes of [T, n, d]: the sum in lane order, then one division."""
    out = lanes[:, 0].copy()
    for lane in range(1, lanes.shape[1]):
        out += lanes[:, lane]
    out /= F32(lanes.shape[1])
    return out


def mix_lanes(hres: np.ndarray, lanes: np.ndarray, hpost: np.ndarray, y: np.ndarray) -> np.ndarray:
    """New lanes `X_i = sum_j hres_ij X_j + hpost_i y` (README step 5), j in order."""
    out = np.empty_like(lanes)
    for lane in range(lanes.shape[1]):
        out[:, lane] = lane_sum(hres[:, lane], lanes)
        out[:, lane] += hpost[:, lane, None] * y
    return out


def matmul_lane_sum(weights: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """`lane_sum` as one batched matmul (float numerics)."""
    return (weights[:, None, :] @ lanes)[:, 0]


def scatter(hres: np.ndarray, lanes: np.ndarray, hpost: np.ndarray, update: np.ndarray
            ) -> np.ndarray:
    """New lanes `hres X + hpost y` for lanes [T, n, d] and the block update y [T, d], written
    back into `lanes` a block of positions at a time (a position's new lanes depend only on
    its own old lanes; every product and sum is the same as on the whole array)."""
    rows = lanes.shape[0]
    out = np.empty((min(rows, SCATTER_BLOCK),) + lanes.shape[1:], F32)
    for first in range(0, rows, SCATTER_BLOCK):
        block = slice(first, first + SCATTER_BLOCK)
        new = np.matmul(hres[block], lanes[block], out=out[: min(rows - first, SCATTER_BLOCK)])
        new += hpost[block, :, None] * update[block, None, :]
        lanes[block] = new
    return lanes


def mean_cells(lanes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Mean over the lanes [C, n, d] -> [C, d] with numpy's reduction (float numerics)."""
    if out is None:
        out = np.empty((lanes.shape[0], lanes.shape[2]), F32)
    np.add.reduce(lanes, axis=1, out=out)
    out /= F32(lanes.shape[1])
    return out
