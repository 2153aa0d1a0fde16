"""The one native library (`needlepoint_native.c` and the headers it includes: exact and
pinned kernels, the Needle 3 step, the transformer int8 kernels), loaded with ctypes; this is
its one binding module (`kernels.i8_native` only re-exports the int8 names).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ABI_VERSION = 17
HERE = Path(__file__).resolve().parent

c_int64_p = ctypes.POINTER(ctypes.c_int64)
T = TypeVar("T")


class CQPart(ctypes.Structure):
    """`np_cq_part` of the C file: one packed CQ matrix and the output column it writes."""

    _fields_ = [
        ("packed", ctypes.c_void_p),
        ("row_bytes", ctypes.c_int64),
        ("norms", ctypes.c_void_p),
        ("rows", ctypes.c_int64),
        ("out_col", ctypes.c_int64),
        ("interleaved", ctypes.c_void_p),
    ]


_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float


class V3Mat(ctypes.Structure):
    """`np_v3_mat` (np_v3_block.h): one `kernels.exact.ExactMatrix`."""

    _fields_ = [("storage_bits", _I64), ("codebook", _P), ("codebook_len", _I64),
                ("parts", _P), ("n_parts", _I64)]


class V3Product(ctypes.Structure):
    """`np_v3_product`: a fused exact product (matrices side by side)."""

    _fields_ = [("mats", _P), ("n_mats", _I64), ("in_pad", _I64), ("out", _I64)]


class V3Layer(ctypes.Structure):
    """`np_v3_layer`: one Needle 3 block's weights."""

    _fields_ = [("phi", V3Product), ("qkvg", V3Product), ("out_proj", V3Product),
                *[(name, _P) for name in (
                    "b_pre", "b_post", "pre_offset", "post_offset", "b_res", "norm_in",
                    "qk_scale", "taps", "post_norm", "pre_hada", "mlp_vec", "mlp_mats",
                    "cond_v", "cond_u")],
                ("n_taps", _I64), ("engram_site", _I64),
                ("a_pre", _F32), ("a_post", _F32), ("a_res", _F32), ("attn_gate", _F32)]


class V3Site(ctypes.Structure):
    """`np_v3_site`: one engram site's CQ tables, key|value product and taps."""

    _fields_ = [("packed", _P), ("norms", _P), ("codebook", _P),
                *[(name, _I64) for name in ("row_bytes", "groups", "storage_bits", "cols")],
                ("key_value", V3Product), ("taps", _P), ("n_taps", _I64), ("dilation", _I64)]


class V3Model(ctypes.Structure):
    """`np_v3_model`: geometry, blocks, engram sites and read-out of a Needle 3 model."""

    _fields_ = [*[(name, _I64) for name in (
                    "d", "lanes", "heads", "kv_heads", "qk", "vd", "hada_n", "ba", "max_seq",
                    "threads")],
                *[(name, _P) for name in (
                    "layers", "p1", "p2", "rope_cos", "rope_sin", "final_norm")],
                ("lm_head", V3Product), ("sites", _P), ("n_sites", _I64), ("tables", _I64),
                ("slots", _I64), ("table_order", _P), ("table_seed", _P), ("h", _F32),
                ("emb_packed", _P), ("emb_norms", _P), ("emb_codebook", _P),
                *[(name, _I64) for name in ("emb_row_bytes", "emb_groups", "emb_storage_bits")]]


class Arena(ctypes.Structure):
    """`np_arena`: a native call's scratch kept between calls (np_v3_types.h); its buffers
    are freed by `np_arena_free`."""

    _fields_ = [("buf", _P * 6), ("cap", ctypes.c_size_t * 6)]


class V3Cache(ctypes.Structure):
    """`np_v3_cache`: one layer's int8 K/V store, raw q|k|v ring and [position, filled]."""

    _fields_ = [*[(name, _P) for name in ("kcode", "kscale", "vcode", "vscale", "raw", "meta")],
                ("capacity", _I64), ("window", _I64), ("raw_rows", _I64), ("ktile", _P),
                ("ksum", _P)]


class V3Part(ctypes.Structure):
    """`np_v3_part`: one session's chunk (rows row0.., positions start..), its caches."""

    _fields_ = [("row0", _I64), ("count", _I64), ("start", _I64), ("caches", _P),
                ("tokens", _P), ("known", _I64), ("engram", _P), ("engram_rows", _I64)]


class I8Part(ctypes.Structure):
    """`i8_part` of np_i8.h: one packed weight (`kernels.i8.I8Weight`, wtype 0) or a weight
    as its file stores it (`kernels.blockweight.BlockWeight`: wtype its type's native id,
    data its rows, row_bytes apart)."""

    _fields_ = [("n_out", _I64), ("groups", _I64), ("nb", _I64), ("bits", _I32),
                ("threads", _I32), ("half", _I32), ("wtype", _I32), ("data", _P),
                ("scale", _P), ("offset", _P), ("row_bytes", _I64)]


class I8Lin(ctypes.Structure):
    """`i8_lin`: one input into `n_parts` weights, outputs side by side (+ bias)."""

    _fields_ = [("parts", ctypes.POINTER(I8Part)), ("n_parts", _I64), ("k_in", _I64),
                ("k_pad", _I64), ("n_total", _I64), ("bias", _P)]


class I8Layer(ctypes.Structure):
    """`i8_layer`: a pre-norm transformer block (np_i8_block.h)."""

    _fields_ = [("d", _I64), ("heads", _I64), ("kv_heads", _I64), ("head_dim", _I64),
                ("d_ff", _I64), ("gated", _I32), ("gelu", _I32), ("center", _I32),
                ("rope", _I32), ("eps", ctypes.c_double), ("factor", ctypes.c_float),
                ("unused", _I32), ("n1w", _P), ("n1b", _P), ("n2w", _P), ("n2b", _P),
                ("qkv", I8Lin), ("o", I8Lin), ("up", I8Lin), ("down", I8Lin)]


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
    lib.np_cq_interleave.argtypes = [p, i64, i64, i64, p]
    lib.np_cq_interleave.restype = None
    lib.np_cq_block4.argtypes = [p, i64, i64, i64, p]
    lib.np_cq_block4.restype = None
    lib.np_cq_kernel.argtypes = [i32]
    lib.np_cq_kernel.restype = i32
    lib.np_matmul_seq.argtypes = [p, i64, i64, i64, p, i64, p]
    lib.np_matmul_seq.restype = None
    lib.np_exp32.argtypes = [f32]
    lib.np_exp32.restype = f32
    lib.np_attend.argtypes = [p, p, i64, i64, p, i32, p, p, p, i64, p, p, i64, f64, p, p]
    lib.np_attend.restype = None
    lib.np_exp32_array.argtypes = [p, i64, p]
    lib.np_exp32_array.restype = None
    lib.np_exp64_array.argtypes = [p, i64, p]
    lib.np_exp64_array.restype = None
    lib.np_a8_codes.argtypes = [p, i64, i64, p, p]
    lib.np_a8_codes.restype = i32
    lib.np_a16_codes.argtypes = [p, i64, i64, p, p]
    lib.np_a16_codes.restype = i32
    lib.np_hadamard_mlp.argtypes = [p, i64, i64, i64, i64, i64, p, p, p, p, i64, p, p, p]
    lib.np_hadamard_mlp.restype = i32
    lib.np_sinkhorn.argtypes = [p, i64, i64, i32, p]
    lib.np_sinkhorn.restype = i32
    lib.np_dequant_rows.argtypes = [p, i64, i64, f32, p]
    lib.np_dequant_rows.restype = None
    lib.np_v3_blocks.argtypes = [p, i64, i64, p, i64, p, i64, p, p, p, i64, i64]
    lib.np_v3_blocks.restype = i32
    lib.np_v3_readout.argtypes = [p, p, p, i64, p]
    lib.np_v3_readout.restype = i32
    lib.np_v3_engram.argtypes = [p, p, i64, i64, p, p]
    lib.np_v3_engram.restype = i32
    lib.np_v3_step.argtypes = [p, p, i64, p, p, i64, p, i64, p, i64, p, i64, p]
    lib.np_v3_step.restype = i32
    lib.np_arena_free.argtypes = [p]
    lib.np_arena_free.restype = None
    lib.np_force_variant.argtypes = [i32]
    lib.np_force_variant.restype = i32
    _i8_signatures(lib)


def _i8_signatures(lib: ctypes.CDLL) -> None:
    """The int8 kernels' entry points (np_i8.h, np_i8_block.h)."""
    p, i64, i32, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
    lib.i8_quantize.argtypes = [p, i64, i64, i64, p, p, p]
    lib.i8_quantize.restype = i32
    lib.i8_norm.argtypes = [p, i64, i64, p, p, f64, i32, p]
    lib.i8_norm.restype = i32
    lib.i8_matmul.argtypes = [p, p, p, i64, i64, i32, p, p, p, i32, i64, i64, p, p, i64, i32]
    lib.i8_matmul.restype = i32
    lib.i8_attend_causal.argtypes = [p, p, i64, i64, i64, i64, i64, p, p, p, p, p, p]
    lib.i8_attend_causal.restype = None
    lib.wt_matmul.argtypes = [p, p, p, i64, i64, i32, p, i64, i64, p, p, i64, i32]
    lib.wt_matmul.restype = i32
    lib.i8_block.argtypes = [ctypes.POINTER(I8Layer), p, i64, i64, p, p, p, p, p, p]
    lib.i8_block.restype = i32


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


def library(use_native: bool | None = None) -> ctypes.CDLL | None:
    """The library a kernel wrapper calls, or None for its numpy reference: None when the
    library is not loaded (or `LIBRARY` was set to None) or the caller passes
    `use_native=False`."""
    return LIBRARY if use_native is not False else None


def dispatch(use_native: bool | None, reference: Callable[..., T],
             kernel: Callable[..., T], *args: Any) -> T:
    """`kernel(lib, *args)` with the loaded library, else `reference(*args)`, the numpy
    reference that computes the same bits (`library(use_native)` decides): the one place a
    `kernels` wrapper picks its path, so every wrapper is this call and its native half."""
    lib = library(use_native)
    return reference(*args) if lib is None else kernel(lib, *args)


VARIANTS = ("baseline", "avx2+fma", "avx512vnni")


def simd_variant() -> str:
    """Which compiled variant runs: "avx512vnni", "avx2+fma", "baseline", or "none" (numpy
    reference). NEEDLEPOINT_NATIVE_VARIANT=0 / 1 caps it at the baseline / AVX2 variant."""
    if LIBRARY is None:
        return "none"
    return VARIANTS[LIBRARY.np_simd_variant()]
