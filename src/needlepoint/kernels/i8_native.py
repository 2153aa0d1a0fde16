"""The int8 kernels' names in the one native library (`kernels/native`: np_i8.h and its
headers, bound and loaded there). `LIBRARY` is that library, or None when it is not built or
disabled with `NEEDLEPOINT_NATIVE=0`; `kernels.i8` then runs its numpy reference, which
computes the same bits.
"""

from __future__ import annotations

from .native import (  # the one variants table (issue 26 item 4)
    LIBRARY,
    UNAVAILABLE_REASON,
    VARIANTS,
    simd_variant,
)
from .native import I8Layer as Layer
from .native import I8Lin as Lin
from .native import I8Part as Part

__all__ = ["LIBRARY", "UNAVAILABLE_REASON", "VARIANTS", "Layer", "Lin", "Part", "library",
           "simd_variant"]


def library(use_native: bool | None = None):
    """`native.library` for the int8 wrappers (this module's `LIBRARY`, so a test can turn
    the int8 kernels alone to their references)."""
    return LIBRARY if use_native is not False else None
