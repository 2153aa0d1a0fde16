"""The int8 product's SIMD tiles (`native/np_i8_tile.h`: up to 8 rows per weight group on
AVX-512 VNNI, 4 on AVX2, one fused multiply-add in the epilogue) give the numpy reference's
bits at every tile edge: row counts 1..9, 16, 17, 33 (full tiles and every remainder), odd and
single-block K, 4-bit Q4 / 8-bit Q5-style offset / signed int8 weights, float16 and float32
scales, with and without bias, on every variant this CPU runs."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import native_lib  # noqa: F401 (the `lib` fixture, requested by name)

from needlepoint.errors import NonFiniteActivationError
from needlepoint.kernels import i8

F32 = np.float32
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33)


def _weight(rng, n: int, k: int, kind: str, half: bool) -> i8.I8Weight:
    k_pad = i8.padded(k)
    if kind == "int8":
        codes, scale = i8.quantize_weight(rng.standard_normal((n, k)).astype(F32))
        if half:
            scale = scale.astype(np.float16).astype(F32)
        return i8.pack_weight(codes, scale, n_out=n, k_in=k, half=half)
    codes = rng.integers(0, 16 if kind == "q4" else 32, (n, k_pad)).astype(np.int8)
    codes[:, k:] = 0
    scale = rng.uniform(0.001, 0.05, (n, k_pad // 32)).astype(F32)
    offset = rng.uniform(-0.3, 0.1, (n, k_pad // 32)).astype(F32)
    if half:
        scale, offset = (a.astype(np.float16).astype(F32) for a in (scale, offset))
    return i8.pack_weight(codes, scale, offset, n_out=n, k_in=k, half=half)


def _variants(lib) -> list[int]:
    """The variants this CPU runs, best first (force_variant caps at the best)."""
    return sorted({lib.np_force_variant(v) for v in (2, 1, 0)}, reverse=True)


@pytest.mark.parametrize("kind", ["q4", "q5", "int8"])
@pytest.mark.parametrize("k", [32, 83, 160, 224])  # 1, 3 (padded), 5 and 7 blocks
def test_tiles_equal_the_reference_at_every_edge(lib, kind, k) -> None:
    rng = np.random.default_rng(k + len(kind))
    n = 27  # 4 groups of 8, the last one partly padding
    half = k != 160  # float16 scales, and float32 ones for one K
    w = _weight(rng, n, k, kind, half)
    assert w.bits == (4 if kind == "q4" else 8) and w.half == half
    bias = rng.standard_normal(n).astype(F32)
    x = (rng.standard_normal((max(ROWS), k)) * rng.uniform(0.01, 30, (max(ROWS), 1))).astype(F32)
    x[3, : min(k, 32)] = 0.0  # an all-zero block: scale 1, sum 0
    codes, scale, sums = i8.quantize(x, w.k_pad, use_native=False)
    ref = i8.matmul_reference(codes, scale, sums, w, bias)
    ref_nobias = i8.matmul_reference(codes, scale, sums, w)
    for variant in _variants(lib):
        assert lib.np_force_variant(variant) == variant
        for rows in ROWS:
            got = i8.matmul(codes[:rows], scale[:rows], sums[:rows], w, bias)
            np.testing.assert_array_equal(got, ref[:rows], err_msg=f"v{variant} rows {rows}")
            got = i8.matmul(codes[:rows], scale[:rows], sums[:rows], w)
            np.testing.assert_array_equal(got, ref_nobias[:rows])
        for start in (5, 13):  # tiles that start mid-batch see the same rows' bits
            got = i8.matmul(codes[start:33], scale[start:33], sums[start:33], w, bias)
            np.testing.assert_array_equal(got, ref[start:33])


def test_the_fused_epilogue_rounds_like_the_separate_add(lib) -> None:
    """Offsets that almost cancel the scaled dot (ws * D + wm * S near zero, where a wrongly
    rounded intermediate would show) and large ones: the tile's fma(ws, D, wm * S) must be the
    reference's `inner + off` exactly, because both products are exact in float64. (A float64
    one-ulp slip rarely survives the final float32 rounding, so equality here is the contract
    checked on hard inputs, not a proof: the proof is the exactness argument in the header.)"""
    rng = np.random.default_rng(11)
    n, k = 16, 96
    codes = rng.integers(0, 16, (n, k)).astype(np.int8)
    scale = rng.uniform(0.001, 0.05, (n, 3)).astype(F32)
    x = rng.standard_normal((9, k)).astype(F32)
    q = i8.quantize(x, k, use_native=False)
    xcodes, _, xsums = q
    dots = (xcodes.reshape(9, 3, 32).astype(np.int64)[:, None] *
            codes.reshape(n, 3, 32).astype(np.int64)[None]).sum(-1)  # [T, n, nb]
    # wm ~ -ws * D / S for row 0: inner lands near zero for that row, a cancellation
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(xsums[0] != 0, dots[0] / np.where(xsums[0] == 0, 1, xsums[0]), 0.0)
    offset = (-scale * ratio * (1 + rng.uniform(-1e-6, 1e-6, (n, 3)))).astype(F32)
    offset[0, 0] = F32(1e30)  # large: exact products, one rounding of the sum
    w = i8.pack_weight(codes, scale, offset, half=False)
    assert w.bits == 4
    ref = i8.matmul_reference(*q, w)
    assert np.isfinite(ref[:, 1:]).all()
    for variant in _variants(lib):
        lib.np_force_variant(variant)
        for rows in (1, 4, 8, 9):
            np.testing.assert_array_equal(i8.matmul(*(a[:rows] for a in q), w), ref[:rows])


def test_quantizer_vector_blocks_equal_the_reference(lib) -> None:
    """Full 32-blocks take the vector peak / pack / sum path, a partial last block the scalar
    one: ties at .5, negative zeros, subnormals, the largest finite float, and +-inf / NaN
    anywhere in a full block raise."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((40, 200)) * rng.uniform(1e-3, 1e3, (40, 1))).astype(F32)
    x[0, :32] = np.arange(32, dtype=F32) - 15.5  # ties after scaling: peak 15.5 -> s exact
    x[1, :32] = -0.0
    x[2, 32:64] = np.float32(1e-40)  # subnormal block
    x[3, 64] = np.finfo(F32).max
    x[4, 96:128] = 127.0
    x[4, 100] = -127.0
    ref = i8.quantize_reference(x, 224)
    for variant in _variants(lib):
        lib.np_force_variant(variant)
        for a, b in zip(i8.quantize(x, 224), ref, strict=True):
            np.testing.assert_array_equal(a, b)
        for bad_value in (np.inf, -np.inf, np.nan):
            bad = x.copy()
            bad[7, 40] = bad_value  # inside a full block
            with pytest.raises(NonFiniteActivationError):
                i8.quantize(bad, 224)
