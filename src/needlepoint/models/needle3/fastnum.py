"""Few-call float32 helpers for the one-token decode step (`step.py`).

At one position per step every array is tiny, so numpy's per-call overhead (~1 µs) and not
arithmetic is the cost: these do the same float32 operations as `ops`/`norms` in fewer calls.
Matrix-vector products go through `gemv` (`np.einsum`, no BLAS): it streams a C-contiguous
`[in, out]` matrix at memory bandwidth single-threaded, faster than OpenBLAS's sgemv here, and
it never wakes BLAS worker threads (a threaded sgemv per matrix costs milliseconds when the
other core is busy).
"""

from __future__ import annotations

import math

import numpy as np

from ..ops import ONE
from ..ops import RMS_EPS as EPS
from .norms import mean_into

try:  # `np.einsum` without `optimize` is exactly this call, minus ~1 µs of Python wrapping
    from numpy._core.multiarray import c_einsum as einsum
except ImportError:  # pragma: no cover
    einsum = np.einsum

F32 = np.float32
add_reduce, square, sqrt = np.add.reduce, np.square, math.sqrt


def gemv(x: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """`x @ matrix` for x [in] and matrix [in, out] (C-contiguous) -> [out]."""
    return einsum("i,ij->j", x, matrix)


# Mean squares use numpy's own (pairwise) float32 mean, exactly as `norms` does on a chunk:
# deploy numerics turn any 1-ulp difference between stepping and prefill into A8 flips.


def mean_scalar(x: np.ndarray) -> np.float32:
    """`np.mean(x, dtype=float32)` of a 1-D float32 vector, bit for bit (numpy's `_mean`
    divides the float32 sum by an intp count: float64 inside, then cast back)."""
    return F32(float(add_reduce(x)) / x.shape[0])  # the same float64 division


# The square root is taken in float64 and rounded to float32: for sqrt (and +, -, *, /) that
# double rounding is innocuous (53 >= 2 * 24 + 2), so it equals float32 `np.sqrt` bit for bit
# at a fraction of a scalar ufunc call's cost.


def inv_rms(x: np.ndarray) -> np.float32:
    """`1 / sqrt(mean(x^2) + 1e-6)` of a 1-D vector, as a float32 scalar."""
    return ONE / F32(sqrt(mean_scalar(square(x)) + EPS))


def rms_denominator(x: np.ndarray) -> np.float32:
    """`sqrt(mean(x^2) + 1e-6)` of a 1-D vector (ZC norm divides by it)."""
    return F32(sqrt(mean_scalar(square(x)) + EPS))


def zc(x: np.ndarray, one_plus_scale: np.ndarray) -> np.ndarray:
    """`((1 + scale) * x) / sqrt(mean(x^2) + 1e-6)` of a 1-D vector (`norms.zc_norm`)."""
    out = one_plus_scale * x
    out /= rms_denominator(x)
    return out


def zc_rows(x: np.ndarray, one_plus_scale: np.ndarray) -> np.ndarray:
    """`norms.zc_norm` over the last axis of x [rows, k] with a [rows, k] scale table."""
    mean_square = mean_into(np.square(x))[..., 0]
    mean_square += EPS
    np.sqrt(mean_square, out=mean_square)
    out = one_plus_scale * x
    out /= mean_square[:, None]
    return out
