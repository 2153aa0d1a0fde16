"""Numeric kernels: the Walsh-Hadamard transform and Cactus-Quants weights, and the public names
of the deploy (CQ x A8) and int8 products that a kernel microbenchmark needs (docs/api.md
"Public names for clients", `bench/` imports nothing else)."""

from __future__ import annotations

import ctypes

from ..errors import InvalidOptionError
from . import native
from .cq import (
    dequantize,
    dequantize_row,
    dequantize_rows,
    matmul,
    matvec,
    rotated_weights,
    unpack_indices,
)
from .exact import ExactMatrix, a8_rotate, cq_matmul, with_layout
from .fwht import fwht, fwht_groups, hadamard_matrix
from .i8 import BLOCK as I8_BLOCK
from .i8 import I8Weight
from .i8 import matmul as i8_matmul
from .i8 import pack_weight as i8_pack_weight
from .i8 import quantize as i8_quantize
from .native import VARIANTS, simd_variant


def native_library() -> ctypes.CDLL | None:
    """The loaded native library (ctypes, its entry points bound in `kernels/native`), or
    None when it is not built or disabled (`NEEDLEPOINT_NATIVE=0`): what a microbenchmark
    calls directly to time one kernel call without the wrappers' Python work."""
    return native.LIBRARY


def force_variant(variant: str) -> str:
    """Run the native kernels' SIMD `variant` (one of `VARIANTS`), capped at the best this CPU
    runs, for the whole process; returns the variant that runs now ("none" without the
    library). Every variant computes the same bits (docs/numerics.md): this only lets a
    benchmark compare them in one process (set the best back when done)."""
    if variant not in VARIANTS:
        raise InvalidOptionError(f"variant must be one of {VARIANTS}, got {variant!r}")
    lib = native.LIBRARY
    if lib is None:
        return "none"
    return VARIANTS[lib.np_force_variant(VARIANTS.index(variant))]


__all__ = [
    "VARIANTS",
    "ExactMatrix",
    "I8_BLOCK",
    "I8Weight",
    "a8_rotate",
    "cq_matmul",
    "dequantize",
    "dequantize_row",
    "dequantize_rows",
    "force_variant",
    "fwht",
    "fwht_groups",
    "hadamard_matrix",
    "i8_matmul",
    "i8_pack_weight",
    "i8_quantize",
    "matmul",
    "matvec",
    "native_library",
    "rotated_weights",
    "simd_variant",
    "unpack_indices",
    "with_layout",
]
