"""The two RMS normalisations in upstream's exact operation order (fixture README step 5).

Deploy numerics are discontinuous at every A8 rounding boundary, so the float32 rounding of
each step matters: upstream's `_rms_unit` is `x * rsqrt(mean(x^2) + 1e-6)` and its `ZCRMSNorm`
is `((1 + scale) * x) / sqrt(mean(x^2) + 1e-6)`; both are reproduced literally here.
"""

from __future__ import annotations

import numpy as np

from ..ops import RMS_EPS as EPS

F32 = np.float32


def mean_into(x: np.ndarray, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    """`np.mean(x, axis, keepdims=True, dtype=float32)` bit for bit (the float32 sum, then a
    true divide by the count as an intp, float64 inside, as numpy's `_mean` does), without
    `np.mean`'s Python-level overhead (a few µs a call, paid ~100 times per decode step)."""
    total = np.add.reduce(x, axis=axis, keepdims=True, out=out)
    return np.true_divide(total, np.intp(x.shape[axis]), out=total, casting="unsafe")


def mean_square(x: np.ndarray) -> np.ndarray:
    """`mean(x^2)` over the last axis (keepdims, float32)."""
    return mean_into(np.square(x))


def _rms_denominator(x: np.ndarray) -> np.ndarray:
    """`sqrt(mean(x^2) + 1e-6)` over the last axis (keepdims), in place on the mean."""
    out = mean_square(x)
    out += EPS
    return np.sqrt(out, out=out)


def rms_unit(x: np.ndarray) -> np.ndarray:
    """`x * rsqrt(mean(x^2) + 1e-6)` over the last axis (upstream `_rms_unit`)."""
    inverse = _rms_denominator(x)
    np.divide(F32(1.0), inverse, out=inverse)
    return x * inverse


def zc_norm(x: np.ndarray, one_plus_scale: np.ndarray) -> np.ndarray:
    """`((1 + scale) * x) / sqrt(mean(x^2) + 1e-6)` (upstream `ZCRMSNorm`); the caller passes
    `1 + scale` precomputed."""
    out = one_plus_scale * x
    out /= _rms_denominator(x)
    return out
