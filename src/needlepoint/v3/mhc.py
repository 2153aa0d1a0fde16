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

from ..ops import fake_quant_a8, sigmoid
from .norms import rms_unit
from .weights import MhcWeights

F32 = np.float32


def sinkhorn(logits: np.ndarray, iterations: int = 20) -> np.ndarray:
    """`ops.sinkhorn` (upstream `_sinkhorn`: subtract the row, then the column log-sum-exp,
    `iterations` times, then exp) with the same arithmetic, in raw ufunc calls: on a decode
    step the [1, n, n] arrays are tiny and per-call overhead is the whole cost."""
    z = np.asarray(logits, F32)
    peak_of, total_of, exp, log = np.maximum.reduce, np.add.reduce, np.exp, np.log
    for _ in range(iterations):
        peak = peak_of(z, axis=-1, keepdims=True)
        z = z - (log(total_of(exp(z - peak), axis=-1, keepdims=True)) + peak)
        peak = peak_of(z, axis=-2, keepdims=True)
        z = z - (log(total_of(exp(z - peak), axis=-2, keepdims=True)) + peak)
    return exp(z)


def route(lanes: np.ndarray, mhc: MhcWeights, quantized: bool):
    """Routing gates of one block for lanes [T, n, d]: (u [T, d], hpost [T, n], hres [T, n, n])."""
    rows, n, width = lanes.shape
    normed = rms_unit(lanes.reshape(rows, n * width))
    if quantized:
        normed = fake_quant_a8(normed)
    mixed = normed @ mhc.phi  # [T, n + n + n*n]
    hpre = sigmoid(mhc.a_pre * mixed[:, :n] + mhc.b_pre + mhc.pre_offset)
    hpost = F32(2.0) * sigmoid(mhc.a_post * mixed[:, n : 2 * n] + mhc.b_post + mhc.post_offset)
    hres = sinkhorn(mhc.a_res * mixed[:, 2 * n :].reshape(rows, n, n) + mhc.b_res)
    u = (hpre[:, None, :] @ lanes)[:, 0]
    return u, hpost, hres


def scatter(lanes: np.ndarray, update: np.ndarray, hpost: np.ndarray, hres: np.ndarray):
    """New lanes `hres X + hpost y` for lanes [T, n, d] and the block update y [T, d]."""
    return hres @ lanes + hpost[:, :, None] * update[:, None, :]
