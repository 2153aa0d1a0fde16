"""The int8 kernels' names in the one native library (`kernels/native`: np_i8.h and its
headers, bound and loaded there). `LIBRARY` is that library, or None when it is not built or
disabled with `NEEDLEPOINT_NATIVE=0`. Every kernel wrapper picks its path through
`native.dispatch` (the one helper), so `kernels.i8` runs its numpy reference, which computes
the same bits, when `native.LIBRARY` is None. The variants table and `simd_variant` are the
library's own (one table, one environment variable).
"""

from __future__ import annotations

from .native import (
    LIBRARY,
    UNAVAILABLE_REASON,
    VARIANTS,
    simd_variant,
)
from .native import I8Layer as Layer
from .native import I8Lin as Lin
from .native import I8Part as Part

__all__ = ["LIBRARY", "UNAVAILABLE_REASON", "VARIANTS", "Layer", "Lin", "Part", "simd_variant"]
