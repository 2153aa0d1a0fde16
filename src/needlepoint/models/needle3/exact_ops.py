"""The pieces of the deploy forward pass that make it exact and batch-invariant (docs/numerics.md).

* `product(x, w)`: a float arena matrix multiplies through BLAS (float numerics); a list of
  `ExactMatrix` is an exact CQ x A8 product (`kernels.exact.a8_product`; the A8 of x is part of
  it, fixture README "Deploy quantization" (1), (4)-(7)).
* `sigmoid`, `softmax_rows`: through the pinned exp (`kernels.pinned.exp32`).
* `small_product`: the FP16 matrices of the Hadamard MLP (`cond_v`, `cond_u`, the Monarch
  factors) in pinned sequential order (`kernels.pinned.matmul_seq`).
* `lane_sum`, `mix_lanes`: sums over the n mHC lanes in lane order, elementwise.
Every operation acts on each position's row alone, in the same order whatever the number of
rows: prefill chunks of any size and decode steps give the same bits.
"""

from __future__ import annotations

import numpy as np

from ...kernels import exact, pinned

F32 = np.float32


def product(x: np.ndarray, weight) -> np.ndarray:
    """`x @ W` for a float `[in, out]` matrix, or the exact `A8(x) @ W^T` for CQ products."""
    if isinstance(weight, np.ndarray):
        return x @ weight
    return exact.a8_product(x, weight)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return pinned.sigmoid(x)


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
