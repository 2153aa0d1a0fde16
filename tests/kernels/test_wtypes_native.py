"""The native products over GGUF blocks as stored (`kernels/native/np_wt.h`) give the numpy
reference's bits (`kernels.blockweight.matmul_reference`) for every integer weight type, any
row count, thread count and SIMD variant (each variant also in a fresh process), at the
extremes (all codes equal, +-127 activations, float16 scales at their limits); and
`Int8Linear` takes BlockWeight parts beside packed ones."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import (
    native_lib,  # noqa: F401 (the `lib` fixture, requested by name)
    variant_results,
)
from wtype_helpers import INTEGER_TYPES, random_rows

from needlepoint.kernels import blockweight, i8, native, wtypes
from needlepoint.kernels.blockweight import BlockWeight
from needlepoint.models.transformer.linear import Int8Linear, fuse

F32 = np.float32


def _activations(rng, rows: int, k: int) -> np.ndarray:
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.1, 20, (rows, 1))).astype(F32)
    x[0, :32] = 0.0  # an all-zero block
    return x


def _cases(name: str, seed: int):
    """(weight, quantised activations, bias) of a few shapes of type `name`."""
    rng = np.random.default_rng(seed)
    k = 512
    n = 37  # not a multiple of the 4-row tile
    w = BlockWeight(wtypes.weight_type(name), random_rows(name, n, k, rng), n, k)
    x = _activations(rng, 17, k)
    return w, i8.quantize_reference(x, k), rng.standard_normal(n).astype(F32)


def check_type(name: str, seed: int = 0) -> dict:
    """{case: native == reference} for type `name` in this process's variant."""
    w, q, bias = _cases(name, seed)
    ref = blockweight.matmul_reference(*q, w, bias)
    results = {}
    for rows in (1, 3, 17):
        part = [a[:rows] for a in q]
        for threads in (1, 2):
            w.threads = threads
            got = blockweight.matmul(*part, w, bias, use_native=True)
            results[f"{name} T={rows} threads={threads}"] = bool(
                np.array_equal(got.view(np.uint32), ref[:rows].view(np.uint32)))
    w.threads = 1
    wide = np.full((17, w.n_out + 6), 7.0, F32)
    blockweight.matmul(*q, w, bias, out=wide[:, 3 : 3 + w.n_out], use_native=True)
    results[f"{name} strided out"] = bool(np.array_equal(wide[:, 3 : 3 + w.n_out], ref)
                                          and (wide[:, :3] == 7).all())
    return results


def check_extremes(name: str) -> dict:
    """All codes equal (every byte 0x00, 0xFF, 0x88), +-127 activations, float16 scales at
    the extremes (largest normal, smallest subnormal); the rows together and each alone."""
    rng = np.random.default_rng(3)
    k, n = 256, 9
    x = np.full((3, k), 127.0, F32)
    x[1, ::2] = -127.0
    x[2] = rng.choice([-127.0, 127.0, 0.0], k)
    q = i8.quantize_reference(x, k)
    results = {}
    for byte in (0x00, 0xFF, 0x88):
        for half in (65504.0, 6e-8, -65504.0):
            data = random_rows(name, n, k, rng, halves=np.array([half]))
            blocks = data.reshape(-1, wtypes.weight_type(name).block_bytes)
            keep = np.zeros(blocks.shape[1], bool)  # overwrite everything but the scales
            from wtype_helpers import HALF_AT
            for at in HALF_AT[name]:
                keep[at : at + 2] = True
            blocks[:, ~keep] = byte
            w = BlockWeight(wtypes.weight_type(name), data, n, k)
            ref = blockweight.matmul_reference(*q, w)
            got = blockweight.matmul(*q, w, use_native=True)
            results[f"{name} byte={byte} d={half}"] = bool(
                np.array_equal(got.view(np.uint32), ref.view(np.uint32)))
            for t in range(3):  # one row at a time: the T=1 path (unsigned codes + bias)
                one = blockweight.matmul(*[a[t : t + 1] for a in q], w, use_native=True)
                results[f"{name} byte={byte} d={half} row {t} alone"] = bool(
                    np.array_equal(one.view(np.uint32), ref[t : t + 1].view(np.uint32)))
    return results


def check_everything() -> dict:
    results = {"variant": native.simd_variant()}
    for i, name in enumerate(INTEGER_TYPES):
        results.update(check_type(name, i))
        results.update(check_extremes(name))
    return results


def test_the_block_kernels_are_built() -> None:
    assert native.LIBRARY is not None, native.UNAVAILABLE_REASON


@pytest.mark.parametrize("name", INTEGER_TYPES)
def test_native_equals_reference_every_variant(lib, name) -> None:
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        results = {**check_type(name, 5), **check_extremes(name)}
        assert [case for case, equal in results.items() if not equal] == [], variant


@pytest.mark.parametrize("cap", ["0", "1", "best"])
def test_every_variant_in_a_fresh_process(cap) -> None:
    results = variant_results(cap, "test_wtypes_native", "check_everything()")
    variant = results.pop("variant")
    if cap == "0":
        assert variant == "baseline"
    elif cap == "1":
        assert variant in ("avx2+fma", "baseline")
    assert len(results) > 150
    assert [case for case, equal in results.items() if not equal] == []


def test_int8_linear_with_block_weight_parts(lib) -> None:
    """Int8Linear over [Q6_K part, packed I8Weight part, Q5_0 part]: each part's columns are
    that part's own product; fuse keeps BlockWeight parts as parts."""
    rng = np.random.default_rng(9)
    k = 256
    a = BlockWeight(wtypes.weight_type("Q6_K"), random_rows("Q6_K", 12, k, rng), 12, k)
    b_codes, b_scale = i8.quantize_weight(rng.standard_normal((16, k)).astype(F32))
    b = i8.pack_weight(b_codes, b_scale)
    c = BlockWeight(wtypes.weight_type("Q5_0"), random_rows("Q5_0", 9, k, rng), 9, k)
    bias = rng.standard_normal(37).astype(F32)
    x = _activations(rng, 5, k)
    q = i8.quantize_reference(x, k)
    expect = np.concatenate([blockweight.matmul_reference(*q, a),
                             i8.matmul_reference(*q, b),
                             blockweight.matmul_reference(*q, c)], axis=1) + bias
    lin = fuse([Int8Linear([a], bias[:12]), Int8Linear([b], bias[12:28]),
                Int8Linear([c], bias[28:])])
    assert [type(p).__name__ for p in lin.parts] == ["BlockWeight", "I8Weight", "BlockWeight"]
    for variant in (2, 1, 0):
        lib.np_force_variant(variant)
        np.testing.assert_array_equal(lin(x), expect)
    assert "Q6_K" in repr(lin)


@pytest.mark.parametrize("name", ["Q8_0", "Q5_0", "Q4_K", "Q6_K", "Q2_K"])
def test_thread_split_gives_the_same_bits(lib, name) -> None:
    """A product big enough to be split on the worker pool (over NP_POOL_MIN_WORK
    multiply-adds): 1, 2 and 3 threads give the reference's bits (each output whole on one
    thread)."""
    rng = np.random.default_rng(21)
    n, k, rows = 523, 512, 17
    w = BlockWeight(wtypes.weight_type(name), random_rows(name, n, k, rng), n, k)
    assert rows * n * k > 1 << 22
    q = i8.quantize_reference(_activations(rng, rows, k), k)
    ref = blockweight.matmul_reference(*q, w)
    for variant in (2, 0):
        lib.np_force_variant(variant)
        for threads in (1, 2, 3):
            w.threads = threads
            np.testing.assert_array_equal(blockweight.matmul(*q, w), ref)
