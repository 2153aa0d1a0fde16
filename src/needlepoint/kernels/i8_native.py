"""The native int8 kernels (`i8native/np_i8.c`), loaded with ctypes.

The C file is built by setup.py (`pip install -e .`) as its own optional extension module
(`needlepoint.kernels.i8native._np_i8`). `LIBRARY` is the loaded library, or None when the
build is missing or disabled with `NEEDLEPOINT_NATIVE=0`; `kernels.i8` then runs its numpy
reference, which computes the same bits (one warning says so).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import warnings
from pathlib import Path

ABI_VERSION = 3
FOLDER = Path(__file__).resolve().parent / "i8native"
_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32


class Part(ctypes.Structure):
    """`i8_part` of np_i8.c: one packed weight (`kernels.i8.I8Weight`)."""

    _fields_ = [("n_out", _I64), ("groups", _I64), ("nb", _I64), ("bits", _I32),
                ("threads", _I32), ("half", _I32), ("unused", _I32), ("data", _P),
                ("scale", _P), ("offset", _P)]


class Lin(ctypes.Structure):
    """`i8_lin`: one input into `n_parts` weights, outputs side by side (+ bias)."""

    _fields_ = [("parts", ctypes.POINTER(Part)), ("n_parts", _I64), ("k_in", _I64),
                ("k_pad", _I64), ("n_total", _I64), ("bias", _P)]


class Layer(ctypes.Structure):
    """`i8_layer`: a pre-norm transformer block (np_i8_block.h)."""

    _fields_ = [("d", _I64), ("heads", _I64), ("kv_heads", _I64), ("head_dim", _I64),
                ("d_ff", _I64), ("gated", _I32), ("gelu", _I32), ("center", _I32),
                ("rope", _I32), ("eps", ctypes.c_double), ("factor", ctypes.c_float),
                ("unused", _I32), ("n1w", _P), ("n1b", _P), ("n2w", _P), ("n2b", _P),
                ("qkv", Lin), ("o", Lin), ("up", Lin), ("down", Lin)]


def _signatures(lib: ctypes.CDLL) -> None:
    p, i64, i32, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
    lib.i8_abi_version.restype = i32
    lib.i8_simd_variant.restype = i32
    lib.i8_force_variant.argtypes = [i32]
    lib.i8_force_variant.restype = i32
    lib.i8_quantize.argtypes = [p, i64, i64, i64, p, p, p]
    lib.i8_quantize.restype = i32
    lib.i8_norm.argtypes = [p, i64, i64, p, p, f64, i32, p]
    lib.i8_norm.restype = i32
    lib.i8_matmul.argtypes = [p, p, p, i64, i64, i32, p, p, p, i32, i64, i64, p, p, i64, i32]
    lib.i8_matmul.restype = i32
    lib.i8_exp32_array.argtypes = [p, i64, p]
    lib.i8_exp32_array.restype = None
    lib.i8_a8_rows.argtypes = [p, i64, i64, p, p]
    lib.i8_a8_rows.restype = i32
    lib.i8_attend_causal.argtypes = [p, p, i64, i64, i64, i64, i64, p, p, p, p, p, p]
    lib.i8_attend_causal.restype = None
    lib.i8_block.argtypes = [ctypes.POINTER(Layer), p, i64, i64, p, p, p, p, p, p]
    lib.i8_block.restype = i32


def load_library() -> tuple[ctypes.CDLL | None, str]:
    """(library, why not) for the built int8 kernels."""
    if os.environ.get("NEEDLEPOINT_NATIVE", "1") == "0":
        return None, "disabled by NEEDLEPOINT_NATIVE=0"
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = FOLDER / f"_np_i8{suffix}"
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
                _signatures(lib)
            except (OSError, AttributeError) as error:
                return None, f"could not load {path.name}: {error}"
            if lib.i8_abi_version() != ABI_VERSION:
                return None, f"{path.name} is from another version (reinstall: pip install -e .)"
            return lib, ""
    return None, "the extension was not built (no C compiler at install time?)"


LIBRARY, UNAVAILABLE_REASON = load_library()
if LIBRARY is None and not UNAVAILABLE_REASON.startswith("disabled"):
    warnings.warn(
        f"needlepoint: native int8 kernels unavailable ({UNAVAILABLE_REASON}); using the numpy "
        "reference kernels (same results, slower)",
        RuntimeWarning,
        stacklevel=2,
    )


VARIANTS = ("baseline", "avx2", "avx512vnni")


def simd_variant() -> str:
    """Which compiled variant runs: "avx512vnni", "avx2", "baseline", or "none" (numpy
    reference)."""
    if LIBRARY is None:
        return "none"
    return VARIANTS[LIBRARY.i8_simd_variant()]
