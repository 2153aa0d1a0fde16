"""The native kernels (`needlepoint_native.c`), loaded with ctypes.

The C file is built by the package's own setup.py (`pip install -e .`) as an optional extension
module next to this file. `LIBRARY` is the loaded library, or None when the build is missing
(no compiler at install time) or disabled with `NEEDLEPOINT_NATIVE=0`; callers then use the
pure-numpy reference (`kernels.exact`), which computes the same bits. One warning says so.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import warnings
from pathlib import Path

ABI_VERSION = 8
HERE = Path(__file__).resolve().parent

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class CQPart(ctypes.Structure):
    """`np_cq_part` of the C file: one packed CQ matrix and the output column it writes."""

    _fields_ = [
        ("packed", ctypes.c_void_p),
        ("row_bytes", ctypes.c_int64),
        ("norms", ctypes.c_void_p),
        ("rows", ctypes.c_int64),
        ("out_col", ctypes.c_int64),
    ]


def _signatures(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    f32, f64 = ctypes.c_float, ctypes.c_double
    lib.np_abi_version.restype = i32
    lib.np_simd_variant.restype = i32
    lib.np_a8_rotate.argtypes = [p, i64, i64, i64, i64, p, p]
    lib.np_a8_rotate.restype = i32
    lib.np_cq_matmul.argtypes = [p, p, i64, i64, i32, p, i64, p, i64, p, i64, i64, i64]
    lib.np_cq_matmul.restype = i32
    lib.np_cq_matmul_threads.argtypes = [p, p, i64, i64, i32, p, i64, p, i64, p, i64, i64, i64, i32]
    lib.np_cq_matmul_threads.restype = i32
    lib.np_matmul_seq.argtypes = [p, i64, i64, i64, p, i64, p]
    lib.np_matmul_seq.restype = None
    lib.np_exp32.argtypes = [f32]
    lib.np_exp32.restype = f32
    lib.np_attend.argtypes = [p, p, i64, i64, p, p, p, p, i64, p, p, i64, f64, p, p]
    lib.np_attend.restype = None
    lib.np_exp32_array.argtypes = [p, i64, p]
    lib.np_exp32_array.restype = None
    lib.np_exp64_array.argtypes = [p, i64, p]
    lib.np_exp64_array.restype = None
    lib.np_a8_codes.argtypes = [p, i64, i64, p, p]
    lib.np_a8_codes.restype = i32
    lib.np_hadamard_mlp.argtypes = [p, i64, i64, i64, i64, i64, p, p, p, p, i64, p, p, p]
    lib.np_hadamard_mlp.restype = i32
    lib.np_sinkhorn.argtypes = [p, i64, i64, i32, p]
    lib.np_sinkhorn.restype = i32
    lib.np_dequant_rows.argtypes = [p, i64, i64, f32, p]
    lib.np_dequant_rows.restype = None


def _candidates() -> list[Path]:
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return [HERE / f"_needlepoint_native{suffix}" for suffix in suffixes]


def load_library() -> tuple[ctypes.CDLL | None, str]:
    """(library, why not) for the built native kernels."""
    if os.environ.get("NEEDLEPOINT_NATIVE", "1") == "0":
        return None, "disabled by NEEDLEPOINT_NATIVE=0"
    for path in _candidates():
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
                _signatures(lib)
            except (OSError, AttributeError) as error:
                return None, f"could not load {path.name}: {error}"
            if lib.np_abi_version() != ABI_VERSION:
                return None, f"{path.name} is from another version (reinstall: pip install -e .)"
            return lib, ""
    return None, "the extension was not built (no C compiler at install time?)"


LIBRARY, UNAVAILABLE_REASON = load_library()
if LIBRARY is None and not UNAVAILABLE_REASON.startswith("disabled"):
    warnings.warn(
        f"needlepoint: native kernels unavailable ({UNAVAILABLE_REASON}); using the numpy "
        "reference kernels (same results, slower)",
        RuntimeWarning,
        stacklevel=2,
    )


VARIANTS = ("baseline", "avx2+fma", "avx512vnni")


def simd_variant() -> str:
    """Which compiled variant runs: "avx512vnni", "avx2+fma", "baseline", or "none" (numpy
    reference). NEEDLEPOINT_NATIVE_VARIANT=0 / 1 caps it at the baseline / AVX2 variant."""
    if LIBRARY is None:
        return "none"
    return VARIANTS[LIBRARY.np_simd_variant()]
