"""mHC lane routing around each block, batched over positions (fixture README step 5).

For block l with lane one-hot `e_l` (of the block's own, possibly ladder-renumbered, index):
  `nx = rms_unit(flatten X)` (A8 in deploy);
  `hpre = sigmoid(a_pre (phi_pre nx) + b_pre + 8 e_l - 4)`, `u = sum_i hpre_i X_i`;
  `hpost = 2 sigmoid(a_post (phi_post nx) + b_post - 4 (1 - e_l))`;
  `hres = Sinkhorn(a_res (phi_res nx as n x n) + b_res)`;
  `X_i <- sum_j hres_ij X_j + hpost_i y` with `y = B(u) - u`.
Sums are taken in upstream's order: `(a m + b) + offset`.
"""

from __future__ import annotations

import numpy as np

from . import exact_ops
from .exact_ops import product
from .fastnum import sigmoid
from .norms import rms_unit
from .sinkhorn import sinkhorn_pinned, sinkhorn_rows
from .weights import MhcWeights

F32 = np.float32
F64 = np.float64


def route(lanes: np.ndarray, mhc: MhcWeights, quantized: bool):
    """Routing gates of one block for lanes [T, n, d]: (u [T, d], hpost [T, n], hres [T, n, n])."""
    rows, n, width = lanes.shape
    normed = rms_unit(lanes.reshape(rows, n * width))
    mixed = product(normed, mhc.phi)  # [T, n + n + n*n]; deploy: the exact A8 product
    gate = exact_ops.sigmoid if quantized else sigmoid
    hpre = gate(mhc.a_pre * mixed[:, :n] + mhc.b_pre + mhc.pre_offset)
    hpost = gate(mhc.a_post * mixed[:, n : 2 * n] + mhc.b_post + mhc.post_offset)
    hpost *= F32(2.0)
    logits = mhc.a_res * mixed[:, 2 * n :].reshape(rows, n, n) + mhc.b_res
    hres = sinkhorn_pinned(logits) if quantized else sinkhorn_rows(logits)
    if quantized:
        return exact_ops.lane_sum(hpre, lanes), hpost, hres
    u = (hpre[:, None, :] @ lanes)[:, 0]
    return u, hpost, hres


# Positions per block of `scatter`'s in-place update: a block's new lanes are a small
# temporary, so a prefill chunk never holds two lanes-sized arrays at once.
SCATTER_BLOCK = 32


def scatter(
    lanes: np.ndarray, update: np.ndarray, hpost: np.ndarray, hres: np.ndarray
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
