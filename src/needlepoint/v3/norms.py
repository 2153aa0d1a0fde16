"""The two RMS normalisations in upstream's exact operation order (fixture README step 5).

Deploy numerics are discontinuous at every A8 rounding boundary, so the float32 rounding of
each step matters: upstream's `_rms_unit` is `x * rsqrt(mean(x^2) + 1e-6)` and its `ZCRMSNorm`
is `((1 + scale) * x) / sqrt(mean(x^2) + 1e-6)`; both are reproduced literally here.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
EPS = F32(1e-6)


def _mean_square(x: np.ndarray) -> np.ndarray:
    return np.mean(np.square(x), axis=-1, keepdims=True, dtype=F32)


def rms_unit(x: np.ndarray) -> np.ndarray:
    """`x * rsqrt(mean(x^2) + 1e-6)` over the last axis (upstream `_rms_unit`)."""
    return x * (F32(1.0) / np.sqrt(_mean_square(x) + EPS))


def zc_norm(x: np.ndarray, one_plus_scale: np.ndarray) -> np.ndarray:
    """`((1 + scale) * x) / sqrt(mean(x^2) + 1e-6)` (upstream `ZCRMSNorm`); the caller passes
    `1 + scale` precomputed."""
    return (one_plus_scale * x) / np.sqrt(_mean_square(x) + EPS)
