"""The int8 row kernels (`kernels.i8_rows`: pinned exp, A8 row codes, causal int8 attention)
give the bits of their numpy references in `kernels.pinned` / `kernels.exact`, in both SIMD
variants, and attention rows do not depend on the other rows of the chunk."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import native_lib  # noqa: F401 (the `lib` fixture, requested by name)

from needlepoint.errors import NonFiniteActivationError
from needlepoint.kernels import exact, i8_rows, pinned

F32 = np.float32


def test_exp32_equals_the_pinned_reference(lib) -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.uniform(-110, 90, 40001), rng.uniform(-1, 1, 4001),
        [0.0, -0.0, 1.0, -87.3, 88.7, -699.9, 700.1, -745.5, 720.0, np.inf, -np.inf, np.nan,
         -103.9, -104.0, 1e-30, -1e-30],
    ]).astype(F32)
    x[::7] *= 8  # some lanes of a SIMD group beyond +-700, beside ordinary ones
    ref = pinned.exp32_reference(x)
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        got = i8_rows.exp32(x)
        np.testing.assert_array_equal(got, ref)
        assert np.isnan(got[np.isnan(x)]).all()


def test_a8_codes_equal_the_exact_reference(lib) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((33, 64)) * rng.uniform(1e-3, 50, (33, 1))).astype(F32)
    x[4] = 0.0
    x[5, :3] = [127.0, 0.5, -1.5]
    ref = exact.a8_codes_reference(x)
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        for a, b in zip(i8_rows.a8_codes(x), ref, strict=True):
            np.testing.assert_array_equal(a, b)
    x[7, 3] = np.inf
    with pytest.raises(NonFiniteActivationError):
        i8_rows.a8_codes(x)


def test_a16_codes_equal_the_exact_reference(lib) -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((33, 64)) * rng.uniform(1e-3, 50, (33, 1))).astype(F32)
    x[4] = 0.0
    x[5, :3] = [32767.0, 0.5, -1.5]
    x[6, :2] = [-3e4, 1e-3]  # a large channel beside small ones (Qwen's keys)
    codes, scale = exact.a16_codes_reference(x)
    assert codes.dtype == np.int16 and codes[6, 0] == -32767 and codes[4].max() == 0
    assert scale[4] == 1.0 and scale[6] == np.float32(np.float32(3e4) / np.float32(32767))
    for variant in (2, 1, 0):
        lib.np_force_variant(variant)
        for a, b in zip(exact.a16_codes(x), (codes, scale), strict=True):
            np.testing.assert_array_equal(a, b)
    x[7, 3] = np.nan
    with pytest.raises(NonFiniteActivationError):
        exact.a16_codes(x)


def _cache(rng, capacity, kv_heads, hd):
    keys = rng.integers(-32768, 32768, (capacity, kv_heads, hd)).astype(np.int16)
    keys[0] = -32768  # the extremes: every partial sum of the vector dots near int32's
    keys[1] = 32767
    values = rng.integers(-128, 128, (capacity, kv_heads, hd)).astype(np.int8)
    scales = lambda: rng.uniform(0.001, 0.2, (capacity, kv_heads)).astype(F32)  # noqa: E731
    return keys, scales(), values, scales()


def _queries(rng, rows, hd):
    """int16 query codes (A16: within +-32767) with the extremes in the first rows."""
    qcode = rng.integers(-32767, 32768, (rows, hd)).astype(np.int16)
    qcode[0] = -32767
    qcode[1, ::2] = 32767
    qcode[2, : min(hd, 40)] = np.arange(-20, 20)[: min(hd, 40)] * 128 + 64  # digit edges
    return qcode


# head sizes: one 16-code chunk; not a multiple of 16 (the AVX2 scalar dots, 8-wide values);
# 64 and 80 (the value sums four vectors at a time, and a remainder); not a multiple of 4 (no
# vector scores); chunks from position 0, of 1..3 rows (no vector scores either) and over
# several 16-key blocks of the VNNI scores with a partial last one
@pytest.mark.parametrize(("hd", "start", "count"), [(16, 9, 5), (24, 9, 5), (64, 0, 11),
                                                    (80, 6, 9), (18, 3, 4), (64, 20, 17),
                                                    (64, 30, 3), (256, 5, 6), (256, 7, 1)])
def test_causal_attention_equals_the_pinned_reference(lib, hd, start, count) -> None:
    rng = np.random.default_rng(2 + hd)
    heads, kv_heads = 6, 2
    capacity = start + count + 3
    kcode, kscale, vcode, vscale = _cache(rng, capacity, kv_heads, hd)
    qcode = _queries(rng, count * heads, hd)
    qscale = rng.uniform(0.01, 0.5, count * heads).astype(F32)
    # the reference: every query row's key slots listed by hand
    slots = np.zeros((count * heads, start + count), np.int64)
    seen = np.zeros(count * heads, np.int64)
    for t in range(count):
        for h in range(heads):
            keys = [p * kv_heads + h // (heads // kv_heads) for p in range(start + t + 1)]
            slots[t * heads + h, : len(keys)] = keys
            seen[t * heads + h] = len(keys)
    flat = capacity * kv_heads
    ref = pinned.attend_reference(qcode, qscale, kcode.reshape(flat, hd), kscale.reshape(flat),
                                  vcode.reshape(flat, hd), vscale.reshape(flat), slots, seen)
    ref = ref.reshape(count, heads * hd)
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        lib.np_force_variant(variant)
        got = i8_rows.attend_causal(qcode, qscale, start, heads, kcode, kscale, vcode, vscale)
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(
        i8_rows.attend_causal(qcode, qscale, start, heads, kcode, kscale, vcode, vscale,
                              use_native=False), ref)
    # the last position alone (a decode step) gives its row of the chunk
    last = i8_rows.attend_causal(qcode[-heads:], qscale[-heads:], start + count - 1, heads,
                                 kcode, kscale, vcode, vscale)
    np.testing.assert_array_equal(last[0], ref[-1])


@pytest.mark.parametrize("hd", [16, 24, 64, 256])
def test_listed_slots_with_int16_keys_equal_the_reference(lib, hd) -> None:
    """`pinned.attend` (the sliding-window caches' path) over int16 keys: native == numpy."""
    rng = np.random.default_rng(40 + hd)
    keys, kscale, values, vscale = _cache(rng, 12, 1, hd)
    keys, values = keys.reshape(12, hd), values.reshape(12, hd)
    kscale, vscale = kscale.reshape(12), vscale.reshape(12)
    qcode = _queries(rng, 5, hd)
    qscale = rng.uniform(0.01, 0.5, 5).astype(F32)
    slots = np.stack([rng.permutation(12)[:9] for _ in range(5)]).astype(np.int64)
    seen = np.array([9, 1, 4, 7, 5], np.int64)
    ref = pinned.attend_reference(qcode, qscale, keys, kscale, values, vscale, slots, seen)
    # a row that sees one key gets that value exactly (its probability is 1)
    single = np.float32(vscale[slots[1, 0]]) * values[slots[1, 0]].astype(F32)
    np.testing.assert_array_equal(ref[1], single)  # one key: probability exactly 1
    for variant in (2, 1, 0):
        lib.np_force_variant(variant)
        np.testing.assert_array_equal(
            pinned.attend(qcode, qscale, keys, kscale, values, vscale, slots, seen), ref)


@pytest.mark.parametrize("hd", [64, 256])
def test_sixteen_bit_scores_are_exact_at_the_extremes(lib, hd) -> None:
    """Queries and keys all at +-32767 (every digit dot at its int32 bound): the scores of
    every variant are the exact integer dots' (the reference's)."""
    rng = np.random.default_rng(70 + hd)
    n = 37
    keys = np.where(rng.random((n, hd)) < 0.5, -32767, 32767).astype(np.int16)
    keys[:4] = -32767
    values = rng.integers(-127, 128, (n, hd)).astype(np.int8)
    kscale = np.full(n, 1e-5, F32)
    vscale = rng.uniform(0.001, 0.2, n).astype(F32)
    qcode = np.stack([np.full(hd, -32767), np.full(hd, 32767),
                      np.where(np.arange(hd) % 3 == 0, 32767, -32767)]).astype(np.int16)
    qscale = np.full(3, 1e-5, F32)
    slots = np.tile(np.arange(n, dtype=np.int64), (3, 1))
    seen = np.array([n, 4, n - 1], np.int64)
    ref = pinned.attend_reference(qcode, qscale, keys, kscale, values, vscale, slots, seen)
    for variant in (2, 1, 0):
        lib.np_force_variant(variant)
        np.testing.assert_array_equal(
            pinned.attend(qcode, qscale, keys, kscale, values, vscale, slots, seen), ref)
        causal = i8_rows.attend_causal(np.repeat(qcode[:1], n, 0), np.repeat(qscale[:1], n),
                                       0, 1, keys.reshape(n, 1, hd), kscale.reshape(n, 1),
                                       values.reshape(n, 1, hd), vscale.reshape(n, 1))
        np.testing.assert_array_equal(causal[-1], ref[0])


def test_query_codes_must_match_the_keys_width(lib) -> None:
    """int8 queries against int16 keys (or the reverse) are refused, not misread."""
    rng = np.random.default_rng(90)
    keys, kscale, values, vscale = _cache(rng, 6, 1, 16)
    q8 = rng.integers(-127, 128, (2, 16)).astype(np.int8)
    slots, seen = np.zeros((2, 6), np.int64), np.array([1, 1], np.int64)
    with pytest.raises(TypeError, match="int16"):
        pinned.attend(q8, np.ones(2, F32), keys.reshape(6, 16), kscale.reshape(6),
                      values.reshape(6, 16), vscale.reshape(6), slots, seen)
    with pytest.raises(TypeError, match="int16"):
        i8_rows.attend_causal(q8, np.ones(2, F32), 0, 2, keys[:, :1], kscale[:, :1],
                              values[:, :1], vscale[:, :1])
