"""Block-scaled int8 kernels (`kernels.i8`, `kernels.i8_ops`): the native kernel and the numpy
reference give the same bits (both SIMD variants, any thread count, any batch), and the
definitions mean what the module docs say (checked by hand in plain Python integers/floats)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_helpers import native_lib  # noqa: F401 (the `lib` fixture, requested by name)

from needlepoint.errors import NonFiniteActivationError
from needlepoint.kernels import i8, i8_native, i8_ops

F32 = np.float32


def _rows(rng, rows, cols, zero_block=True):
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 30, (rows, 1))).astype(F32)
    if zero_block and cols > 40:
        x[0, 32:64] = 0.0
    x[-1, :4] = [127.0, 2.5, -3.5, 0.5]  # scale 1 if nothing larger: ties round to even
    x[-1, 4:32] = np.clip(x[-1, 4:32], -100, 100)
    return x


def _weight(rng, n, k, kind):
    k_pad = i8.padded(k)
    w = rng.standard_normal((n, k)).astype(F32)
    if kind == "int8":
        codes, scale = i8.quantize_weight(w)
        return i8.pack_weight(codes, scale, n_out=n, k_in=k), codes, scale, None
    codes = rng.integers(0, 16 if kind == "q4" else 32, (n, k_pad)).astype(np.int8)
    codes[:, k:] = 0
    scale = rng.uniform(0.001, 0.05, (n, k_pad // 32)).astype(F32)
    offset = rng.uniform(-0.3, 0.1, (n, k_pad // 32)).astype(F32)
    return i8.pack_weight(codes, scale, offset, n_out=n, k_in=k), codes, scale, offset


def test_quantize_native_equals_reference_and_the_definition(lib) -> None:
    rng = np.random.default_rng(0)
    x = _rows(rng, 7, 83)  # 83 is not a multiple of 32: the last block is zero-padded
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        got = i8.quantize(x, 96)
        ref = i8.quantize_reference(x, 96)
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_array_equal(a, b)
    codes, scale, sums = ref
    assert scale[6, 0] == 1.0 and codes[6, :4].tolist() == [127, 2, -4, 0]
    assert scale[0, 1] == 1.0 and not codes[0, 32:64].any()  # an all-zero block
    for t, b in ((2, 0), (6, 2), (3, 1), (6, 0)):
        block = ([float(v) for v in x[t, 32 * b : 32 * b + 32]] + [0.0] * 32)[:32]
        peak = max(abs(v) for v in block)
        s = F32(F32(peak) / F32(127.0))
        assert scale[t, b] == s
        expect = [max(-127, min(127, round(float(F32(F32(v) / s))))) for v in block]
        assert codes[t, 32 * b : 32 * b + 32].tolist() == expect  # round() is half-to-even
        assert sums[t, b] == sum(expect)
    bad = x.copy()
    bad[4, 50] = np.nan
    for use_native in (True, False):
        with pytest.raises(NonFiniteActivationError):
            i8.quantize(bad, 96, use_native=use_native)


def test_pack_weight_round_trips_codes_and_scales() -> None:
    rng = np.random.default_rng(1)
    for kind in ("int8", "q4", "q5"):
        w, codes, scale, offset = _weight(rng, 21, 64, kind)
        assert w.bits == (4 if kind == "q4" else 8)
        np.testing.assert_array_equal(w.codes()[:21], codes)
        assert not w.codes()[21:].any()
        got_scale, got_offset = w.scales()
        np.testing.assert_array_equal(got_scale[:21], scale)
        if offset is not None:
            np.testing.assert_array_equal(got_offset[:21], offset)
    with pytest.raises(ValueError, match="-127"):
        i8.pack_weight(np.full((8, 32), -128, np.int8), np.ones((8, 1), F32))


@pytest.mark.parametrize("kind", ["int8", "q4", "q5"])
def test_matmul_native_equals_reference_any_rows_threads_variant(lib, kind) -> None:
    rng = np.random.default_rng(2)
    n, k = 203, 160  # 203 outputs: the last group of 8 is partly padding
    w, *_ = _weight(rng, n, k, kind)
    bias = rng.standard_normal(n).astype(F32)
    x = _rows(rng, 9, k)
    codes, scale, sums = i8.quantize(x, w.k_pad)
    ref = i8.matmul_reference(codes, scale, sums, w, bias)
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        for threads in (1, 2, 3):
            w.threads = threads
            np.testing.assert_array_equal(i8.matmul(codes, scale, sums, w, bias), ref)
    w.threads = 1
    for variant in (2, 1):
        lib.np_force_variant(variant)
        for rows in (1, 2, 3, 4, 5):  # every row tile of the kernel, and each row on its own
            part = i8.matmul(codes[:rows], scale[:rows], sums[:rows], w, bias)
            np.testing.assert_array_equal(part, ref[:rows])
    for t in range(9):
        np.testing.assert_array_equal(i8.matmul(codes[t : t + 1], scale[t : t + 1],
                                                sums[t : t + 1], w, bias)[0], ref[t])
    wide = np.full((9, n + 10), 7.0, F32)  # a column slice of a wider output
    i8.matmul(codes, scale, sums, w, bias, out=wide[:, 5 : 5 + n])
    np.testing.assert_array_equal(wide[:, 5 : 5 + n], ref)
    assert (wide[:, :5] == 7).all() and (wide[:, 5 + n :] == 7).all()


def test_float16_scales_are_stored_as_such_and_give_the_same_bits(lib) -> None:
    """GGUF's d / m are float16: stored so (fewer bytes), the same values, the same bits."""
    rng = np.random.default_rng(5)
    n, k = 40, 96
    codes = rng.integers(0, 16, (n, k)).astype(np.int8)
    scale = rng.uniform(0.001, 0.05, (n, 3)).astype(np.float16).astype(F32)
    offset = rng.uniform(-0.3, 0.1, (n, 3)).astype(np.float16).astype(F32)
    offset[0, 0] = F32(np.float16(1.8e-7))  # a float16 subnormal (3 x 2^-24)
    half = i8.pack_weight(codes, scale, offset)
    full = i8.pack_weight(codes, scale, offset, half=False)
    assert half.half and not full.half and half.nbytes < full.nbytes
    np.testing.assert_array_equal(half.scales()[0][:n], scale)
    np.testing.assert_array_equal(half.scales()[1][:n], offset)
    assert not i8.pack_weight(codes, scale * F32(1.0001), offset).half  # not exact in float16
    x = _rows(rng, 5, k)
    q = i8.quantize(x, k)
    ref = i8.matmul_reference(*q, full)
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        np.testing.assert_array_equal(i8.matmul(*q, half), ref)
        np.testing.assert_array_equal(i8.matmul(*q, full), ref)
    np.testing.assert_array_equal(i8.matmul_reference(*q, half), ref)


def test_matmul_is_the_defined_epilogue_by_hand() -> None:
    """One output in Python integers and float64, operation by operation."""
    rng = np.random.default_rng(3)
    for kind in ("int8", "q4"):
        w, wcodes, wscale, woffset = _weight(rng, 16, 96, kind)
        x = _rows(rng, 3, 96)
        codes, scale, sums = i8.quantize(x, 96)
        y = i8.matmul(codes, scale, sums, w)
        for t, n in ((0, 3), (2, 15)):
            acc = 0.0
            for b in range(3):
                dot = sum(int(codes[t, 32 * b + i]) * int(wcodes[n, 32 * b + i])
                          for i in range(32))
                inner = float(wscale[n, b]) * dot
                if woffset is not None:
                    inner = inner + float(woffset[n, b]) * int(sums[t, b])
                acc = acc + inner * float(scale[t, b])
            assert y[t, n] == F32(acc)


def test_integer_dots_are_exact_at_the_extremes(lib) -> None:
    """Codes of +-127 everywhere: the int32 dots reach 32 * 127^2 per block and must be exact
    (the AVX2 byte products saturate at 16 bits if done wrong)."""
    k = 1024
    codes = np.full((2, k), 127, np.int8)
    codes[1, ::2] = -127
    wcodes = np.full((8, k), -127, np.int8)
    wcodes[3, 1::3] = 127
    w = i8.pack_weight(wcodes, np.ones((8, k // 32), F32))
    ones = np.ones((2, k // 32), F32)
    sums = codes.reshape(2, -1, 32).astype(np.int32).sum(-1, dtype=np.int32)
    exact = codes.astype(np.int64) @ wcodes.astype(np.int64).T
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        np.testing.assert_array_equal(i8.matmul(codes, ones, sums, w), exact.astype(F32))
    q4 = i8.pack_weight(np.full((8, k), 15, np.int8), np.ones((8, k // 32), F32),
                        np.zeros((8, k // 32), F32))
    assert q4.bits == 4
    expect = (codes.astype(np.int64) * 15).sum(1)
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        np.testing.assert_array_equal(i8.matmul(codes, ones, sums, q4)[:, 0], expect)


@pytest.mark.parametrize("center", [False, True])
def test_norm_native_equals_reference_and_is_accurate(lib, center) -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((6, 100)) * 3 + (2.0 if center else 0.0)).astype(F32)
    w = rng.uniform(0.5, 1.5, 100).astype(F32)
    b = rng.standard_normal(100).astype(F32) if center else None
    ref = i8_ops.norm_reference(x, w, b, 1e-5, center)
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        np.testing.assert_array_equal(i8_ops.norm(x, w, b, 1e-5, center), ref)
    for t in range(6):
        np.testing.assert_array_equal(i8_ops.norm(x[t : t + 1], w, b, 1e-5, center)[0], ref[t])
    row = [float(v) for v in x[2]]
    mean = math.fsum(row) / 100 if center else 0.0
    c = [v - mean for v in row]
    inv = 1 / math.sqrt(math.fsum(v * v for v in c) / 100 + 1e-5)
    expect = [ci * inv * float(wi) + (float(b[i]) if center else 0.0)
              for i, (ci, wi) in enumerate(zip(c, w, strict=True))]
    np.testing.assert_allclose(ref[2], expect, rtol=2e-7, atol=2e-7)


def test_tree_sum_is_the_halving_tree() -> None:
    v = np.array([[1e16, 1.0, -1e16, 1.0, 3.0]])
    # P = 8: [1e16+(-1e16... ] -> ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))
    by_hand = ((1e16 + 3.0) + (-1e16 + 0.0)) + ((1.0 + 0.0) + (1.0 + 0.0))
    assert i8_ops.tree_sum(v)[0] == by_hand


def test_force_variant_falls_back_to_what_the_cpu_runs(lib) -> None:
    flags = open("/proc/cpuinfo").read().split()
    vnni = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"))
    best = 2 if vnni else 1 if "avx2" in flags and "f16c" in flags else 0
    assert lib.np_force_variant(2) == best
    assert i8_native.simd_variant() == i8_native.VARIANTS[best]
    assert lib.np_force_variant(1) == min(best, 1)
    assert lib.np_force_variant(0) == 0 and i8_native.simd_variant() == "baseline"
