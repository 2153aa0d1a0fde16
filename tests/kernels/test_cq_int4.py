"""The 4-bit exact kernels of kernels/native/np_cq_int4.h (AVX-512 VNNI: the blocked kernel
over the 16-row copy `exact.block_codes`, the word-lookup kernel over the packed codes; picked
in np_cq_int.h np_cq_int, np_cq_int16.h's digit kernel elsewhere): the copy's bytes (C builder
== numpy reference == a byte-by-byte definition), the CQ4 record's `layout` and what a load
builds, and the same bits as the numpy reference (`exact.cq_matmul_reference`) in every compiled
variant (each in a fresh process) with the copy present and absent, the default pick and the
digit kernel forced, on adversarial inputs: every code equal (each of 0..15), activations at
+-127 and at the ends of the integer range, codebooks at the `check_codebook` limits and of one
to three base-2^14 digits, 1..17 and 64 activation rows, weight rows and fused parts that end
inside a 16-row block, row ranges that start inside one, 1 and 3 threads."""

from __future__ import annotations

import numpy as np
import pytest
import test_cq_int as base
from cq_helpers import expected_variant, pick_results
from kernel_helpers import variant_results

from needlepoint.kernels import exact, wtypes

F32 = np.float32
# the 4-bit codebooks of test_cq_int (the fixtures' levels, the widest spread check_codebook
# takes, zeros and subnormals, all equal, one digit, the widest gcd spread) and the shipped
# archive's LM head codebook (non-uniform, 16 levels)
SHIPPED16 = [-0.23953155, -0.18070605, -0.14095794, -0.10901255, -0.08151297, -0.05652765,
             -0.03293915, -0.01011611, 0.0127108, 0.03570792, 0.05945826, 0.08497702,
             0.11274162, 0.14469692, 0.184239, 0.2422737]
BOOKS = {"real16": base.REAL16, "edge16": base.EDGE16, "tiny16": base.TINY16,
         "flat16": base.FLAT16, "int16": base.INT16, "wide16": base.WIDE16,
         "shipped16": SHIPPED16}
TILES = (1, 2, 3, 4, 5, 8, 16, 17, 64)


@pytest.mark.parametrize("use_native", [False, True])
def test_blocked_copy_is_the_same_bytes_regrouped_by_register(use_native):
    """Byte 4 i + j of register k of block b and group g is row 16 b + i's byte 64 g + 4 k + j;
    rows past the end are zero: the numpy reference and the native builder, codes given as a
    strided view (an archive slice)."""
    rng = np.random.default_rng(41)
    for rows, groups in ((1, 1), (16, 2), (21, 3), (40, 6)):
        wide = rng.integers(0, 256, (rows + 2, 64 * groups + 64)).astype(np.uint8)
        packed = wide[1 : rows + 1, 64:]
        got = exact.block_codes(packed, use_native)
        blocks = -(-rows // 16)
        assert got.shape == (blocks, 16 * 64 * groups) and got.dtype == np.uint8
        want = np.zeros_like(got)
        for b in range(blocks):
            for g in range(groups):
                for k in range(16):
                    for i in range(16):
                        row = 16 * b + i
                        if row < rows:
                            at = ((g * 16 + k) * 16 + i) * 4
                            want[b, at : at + 4] = packed[row, 64 * g + 4 * k : 64 * g + 4 * k + 4]
        np.testing.assert_array_equal(got, want)


def test_native_builder_equals_the_reference_on_an_archive():
    """The C builder and the numpy reference on the fixtures' 4-bit embedding codes."""
    for m in base._archive_matrices("tiny"):
        for p in m.parts:
            if m.storage_bits == 4:
                np.testing.assert_array_equal(exact.block_codes(p.packed, True),
                                              exact.block_codes_reference(p.packed))


def test_four_bit_records_carry_the_blocked_layout_and_loads_build_it():
    """The CQ4 record names the blocked layout; a load builds it for 4-bit parts (the codes'
    bytes, rows padded to 16) and the interleaved copy for 2-bit ones."""
    assert wtypes.weight_type("CQ4").layout == exact.BLOCKED
    for m in base._archive_matrices("tiny"):
        for p in m.parts:
            want = -(-p.rows // 16) * 16 * p.packed.shape[1]
            assert p.interleaved.nbytes == want
            if m.storage_bits == 4:
                np.testing.assert_array_equal(p.interleaved, exact.block_codes_reference(p.packed))


def _cases() -> list:
    """(name, matrix without the copy, v, scale)."""
    cases = []
    rng = np.random.default_rng(5)
    for rows, groups, parts in ((1, 1, 1), (13, 2, 1), (16, 3, 1), (37, 6, 3), (33, 1, 2)):
        for book_name, book in BOOKS.items():
            matrices = [("random", base._synthetic(rows, groups, book, rows, parts=parts))]
            if rows == 37 or (rows == 13 and book_name in ("edge16", "shipped16")):
                matrices += [(f"all{c}", base._synthetic(
                    rows, groups, book, c, codes=np.full(128 * groups, c), parts=parts))
                    for c in range(16)]
            for tile in TILES if rows in (13, 37) else (1, 2, 5):
                x = rng.standard_normal((tile, 128 * groups)).astype(F32)
                x[0] = np.where(np.arange(128 * groups) % 3, 1.0, -1.0)  # q = +-127
                if tile > 1:
                    x[1] = -1.0  # q = -127 everywhere
                v, scale = exact.a8_rotate(x, 128 * groups)
                if tile > 2:  # the ends of the integer range (v itself, not from a8_rotate)
                    v[2] = -16384
                    v[tile - 1] = np.where(np.arange(128 * groups) % 2, 16383, -16384)
                for kind, m in matrices:
                    cases.append((f"{rows}r-{groups}g-{parts}p-{book_name}-{kind}-T{tile}", m,
                                  v, scale))
    # outside [-2^14, 2^14): the float64 kernel runs
    m = base._synthetic(20, 2, SHIPPED16, 3)
    v = np.array([np.full(256, 16384), np.full(256, -16385)], np.int32)
    cases.append(("out-of-range", m, v, np.ones(2, F32)))
    return cases


def check_int4() -> dict:
    """Native vs reference in this process's variant: {case: equal} for the default pick (0)
    and the digit kernel forced (1), the copy present and absent, 1 and 3 threads, and the
    rows from a third of the way to two thirds alone."""
    return pick_results(_cases(), (0, 1),
                        lambda m: [(m.out // 3, max(m.out // 3 + 1, 2 * m.out // 3), 0)])


@pytest.mark.parametrize("cap", ["0", "1", "best"])
def test_four_bit_kernels_give_the_reference_bits(cap):
    """Each variant in a fresh process (the library picks its variant once per process)."""
    results = variant_results(cap, "test_cq_int4", "check_int4()")
    variant = results.pop("variant")
    assert variant == expected_variant(cap, base._cpu_has_avx2(), base._cpu_has_vnni())
    assert len(results) > 3000
    assert [case for case, equal in results.items() if not equal] == []


def test_blocked_digits_fit_int32():
    """np_cq_int4.h's blocked sums in Python integers: balanced base-2^10 digits e in
    [-511, 512] of u = (k - kc) / gc (at most 4 of them for |u| <= 2^32) rebuild u, and one
    lane's 128 products of a digit and v in [-2^14, 2^14) stay in [-2^30, 2^30]."""
    for u in (0, 1, -1, 511, 512, -512, 2**27, -(2**27) - 3, 2**32, -(2**32), 123456789):
        digits, x = [], u
        while x:
            d = ((x + 511) & 1023) - 511
            digits.append(d)
            x = (x - d) >> 10
        assert len(digits) <= 4
        assert all(-511 <= d <= 512 for d in digits)
        assert sum(d << (10 * p) for p, d in enumerate(digits)) == u
    assert 128 * 512 * 16384 == 2**30 and 128 * 511 * 16384 < 2**30
