"""Needle 3's ZC RMS norm in upstream's exact operation order (fixture README step 5).

Deploy numerics are discontinuous at every A8 rounding boundary, so the float32 rounding of
each step matters: upstream's `ZCRMSNorm` is `((1 + scale) * x) / sqrt(mean(x^2) + 1e-6)`,
reproduced literally here (the plain `_rms_unit` is `ops.rms_unit`).
"""

from __future__ import annotations

import numpy as np

from ..ops import rms_denominator


def zc_norm(x: np.ndarray, one_plus_scale: np.ndarray) -> np.ndarray:
    """`((1 + scale) * x) / sqrt(mean(x^2) + 1e-6)` (upstream `ZCRMSNorm`); the caller passes
    `1 + scale` precomputed."""
    out = one_plus_scale * x
    out /= rms_denominator(x)
    return out
