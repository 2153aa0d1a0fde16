"""mHC residual mixing: Sinkhorn normalisation of the `hres` logits (fixture README "Forward
pass", step 5: 20 rounds of subtracting the row then the column log-sum-exp, then exp).

Upstream's log-domain loop is `ops.sinkhorn` (the one reference, also Needle 2's); here are its
scaling forms: `sinkhorn_rows` the batched form prefill uses, `sinkhorn4` the unrolled scalar
form of one 4 x 4 matrix the float decode step uses, `sinkhorn_pinned` deploy numerics' (the
pinned exp; native `np_sinkhorn`). They fall back to `ops.sinkhorn` when a scaling under- or
overflows.
"""

from __future__ import annotations

import math

import numpy as np

from ...kernels import native, pinned
from ..ops import sinkhorn

F32 = np.float32
F64 = np.float64
maximum_reduce = np.maximum.reduce


def sinkhorn_rows(logits: np.ndarray, rounds: int = 20, exp64=None) -> np.ndarray:
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
    # `exp64` (deploy numerics: kernels.pinned.exp64) pins the exponential across machines
    kernel = np.exp(shifted, dtype=F64) if exp64 is None else exp64(shifted.astype(F64))
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


def sinkhorn4(logits: np.ndarray, rounds: int = 20) -> np.ndarray:
    """Sinkhorn of one 4 x 4 matrix (`mhc.sinkhorn`: `rounds` of subtracting the row then the
    column log-sum-exp, then exp) on Python floats (float64). Subtracting log-sum-exps is
    dividing by sums, so the result is `diag(r) K diag(c)` with `K = exp(z - max z)`,
    `r = 1 / (K c)` and `c = 1 / (K^T r)` alternated: ~1300 unrolled scalar operations, far
    cheaper than the ~280 numpy calls of the log-domain form. The float64 result is within
    float32 rounding of upstream's; an underflowing row or column falls back to that form."""
    a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q = map(
        math.exp, (logits - maximum_reduce(logits, axis=None)).ravel().tolist()
    )
    c0 = c1 = c2 = c3 = 1.0
    try:
        for _ in range(rounds):
            r0 = 1.0 / (a * c0 + b * c1 + c * c2 + d * c3)
            r1 = 1.0 / (e * c0 + f * c1 + g * c2 + h * c3)
            r2 = 1.0 / (i * c0 + j * c1 + k * c2 + m * c3)
            r3 = 1.0 / (n * c0 + o * c1 + p * c2 + q * c3)
            c0 = 1.0 / (a * r0 + e * r1 + i * r2 + n * r3)
            c1 = 1.0 / (b * r0 + f * r1 + j * r2 + o * r3)
            c2 = 1.0 / (c * r0 + g * r1 + k * r2 + p * r3)
            c3 = 1.0 / (d * r0 + h * r1 + m * r2 + q * r3)
    except ZeroDivisionError:
        return sinkhorn(logits[None])[0]
    return np.array(
        [
            [r0 * a * c0, r0 * b * c1, r0 * c * c2, r0 * d * c3],
            [r1 * e * c0, r1 * f * c1, r1 * g * c2, r1 * h * c3],
            [r2 * i * c0, r2 * j * c1, r2 * k * c2, r2 * m * c3],
            [r3 * n * c0, r3 * o * c1, r3 * p * c2, r3 * q * c3],
        ],
        F32,
    )


def sinkhorn_pinned(logits: np.ndarray, rounds: int = 20) -> np.ndarray:
    """`sinkhorn_rows` with the pinned exp (deploy numerics), by the native kernel when it is
    built (the same operations: kernels/native `np_sinkhorn`), else in numpy."""
    lib = native.library()
    if lib is not None:
        z = np.ascontiguousarray(logits, F32)
        out = np.empty_like(z)
        if lib.np_sinkhorn(z.ctypes.data, z.shape[0], z.shape[1], rounds, out.ctypes.data) == 0:
            return out
    return sinkhorn_rows(logits, rounds, exp64=pinned.exp64)
