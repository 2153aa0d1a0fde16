"""The pinned-order pieces of the deploy Hadamard MLP (docs/numerics.md), used by
`mlp.hadamard_mlp_pinned` (the numpy reference of the native `np_hadamard_mlp`):

* `softmax_rows`: through the pinned exp (`kernels.pinned.exp32`).
* `small_product`: the FP16 matrices of the Hadamard MLP (`cond_v`, `cond_u`, the Monarch
  factors) in pinned sequential order (`kernels.pinned.matmul_seq`).
Every operation acts on each position's row alone, in the same order whatever the number of
rows: prefill chunks of any size and decode steps give the same bits.
"""

from __future__ import annotations

import numpy as np

from ...kernels import pinned


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis with the pinned exp (the sum: numpy's per-row reduction)."""
    shifted = x - np.max(x, axis=-1, keepdims=True)
    weights = pinned.exp32(shifted)
    weights /= np.add.reduce(weights, axis=-1, keepdims=True)
    return weights


def small_product(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`x [T, K] @ w [K, N]`, summed over k in order (float32)."""
    return pinned.matmul_seq(x, w)


def monarch(z: np.ndarray, wsa: np.ndarray, wsb: np.ndarray) -> np.ndarray:
    """`flatten(wsa^T Z wsb)` per row of z [T, ba*bb] (mlp.monarch), in pinned order: first
    `Y = Z wsb` (sum over Z's columns), then `wsa^T Y` (sum over Y's rows)."""
    rows = z.shape[0]
    ba, bb = wsa.shape[0], wsb.shape[0]
    right = small_product(z.reshape(rows * ba, bb), wsb).reshape(rows, ba, bb)
    by_column = np.ascontiguousarray(right.transpose(0, 2, 1)).reshape(rows * bb, ba)
    left = small_product(by_column, wsa).reshape(rows, bb, ba)  # [t, j, i] = sum_a Y[a,j] w[a,i]
    return np.ascontiguousarray(left.transpose(0, 2, 1)).reshape(rows, ba * bb)
