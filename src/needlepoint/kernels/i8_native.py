"""The int8 kernels' names in the one native library (`kernels/native`: np_i8.h and its
headers, bound and loaded there). `LIBRARY` is that library, or None when it is not built or
disabled with `NEEDLEPOINT_NATIVE=0`. Every int8 wrapper picks its path through
`native.library` (the one helper), so `kernels.i8` runs its numpy reference, which computes
the same bits, when `native.LIBRARY` is None.
"""

from __future__ import annotations

from .native import LIBRARY, UNAVAILABLE_REASON
from .native import I8Layer as Layer
from .native import I8Lin as Lin
from .native import I8Part as Part

__all__ = ["LIBRARY", "UNAVAILABLE_REASON", "Layer", "Lin", "Part", "simd_variant"]


VARIANTS = ("baseline", "avx2", "avx512vnni")


def simd_variant() -> str:
    """Which compiled variant runs: "avx512vnni", "avx2", "baseline", or "none" (numpy
    reference)."""
    if LIBRARY is None:
        return "none"
    return VARIANTS[LIBRARY.i8_simd_variant()]
