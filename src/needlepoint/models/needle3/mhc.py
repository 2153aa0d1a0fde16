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

from .fastnum import a8_rows, sigmoid
from .norms import rms_unit
from .weights import MhcWeights

F32 = np.float32
F64 = np.float64


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


def sinkhorn_rows(logits: np.ndarray, rounds: int = 20) -> np.ndarray:
    """Sinkhorn of every matrix of logits [T, n, n], as `fastnum.sinkhorn4` computes one (the
    decode step's form, so prefill and stepping agree): `K = exp(z - max z)` in float64, then
    `r = 1 / (K c)`, `c = 1 / (K^T r)` alternated `rounds` times, `diag(r) K diag(c)` cast to
    float32. Batched over T this is 6 numpy calls a round instead of the log-domain form's 14,
    with the same sums in the same order (numpy reduces a length-n axis sequentially, as the
    unrolled scalar code adds). A matrix whose scaling under- or overflows (never in practice)
    falls back to the log-domain `sinkhorn`, as `sinkhorn4` does."""
    rows, n, _ = logits.shape
    peak = logits.reshape(rows, n * n).max(axis=1)
    # [i, j, T]: positions innermost, so every product and sum runs over long vectors
    shifted = np.ascontiguousarray(logits.transpose(1, 2, 0)) - peak  # float32, as sinkhorn4
    kernel = np.exp(shifted, dtype=F64)
    row = col = np.ones(kernel.shape[1:], F64)  # [i, T], [j, T]
    scratch = np.empty_like(kernel)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for _ in range(rounds):
            # r_i = 1 / sum_j K_ij c_j, then c_j = 1 / sum_i K_ij r_i (each summed in order)
            row = np.add.reduce(np.multiply(kernel, col[None], out=scratch), axis=1)
            np.divide(1.0, row, out=row)
            col = np.add.reduce(np.multiply(kernel, row[:, None], out=scratch), axis=0)
            np.divide(1.0, col, out=col)
        out = row[:, None] * kernel
        out *= col[None]
    bad = ~np.isfinite(out).all(axis=(0, 1))
    result = np.ascontiguousarray(out.transpose(2, 0, 1), dtype=F32)
    if bad.any():
        result[bad] = sinkhorn(logits[bad], rounds)
    return result


def route(lanes: np.ndarray, mhc: MhcWeights, quantized: bool):
    """Routing gates of one block for lanes [T, n, d]: (u [T, d], hpost [T, n], hres [T, n, n])."""
    rows, n, width = lanes.shape
    normed = rms_unit(lanes.reshape(rows, n * width))
    if quantized:
        normed = a8_rows(normed, out=normed)  # our own array: quantised in place
    mixed = normed @ mhc.phi  # [T, n + n + n*n]
    hpre = sigmoid(mhc.a_pre * mixed[:, :n] + mhc.b_pre + mhc.pre_offset)
    hpost = sigmoid(mhc.a_post * mixed[:, n : 2 * n] + mhc.b_post + mhc.post_offset)
    hpost *= F32(2.0)
    hres = sinkhorn_rows(mhc.a_res * mixed[:, 2 * n :].reshape(rows, n, n) + mhc.b_res)
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
