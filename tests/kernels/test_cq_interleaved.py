"""The row-interleaved copy of 2-bit codes (`exact.interleave_codes`) and the lookup kernel
paths that read it (kernels/native/np_cq_lut.h np_lut_group1 for one activation row,
np_lut_split for more; picked in np_cq_int.h np_cq_int): the copy's bytes against a
byte-by-byte definition, the weight records' `layout`, what a deploy load builds, and the same
bits as the numpy reference (`exact.cq_matmul_reference`) in every compiled variant (each in a
fresh process), with the copy present and absent, the lookup kernel forced and the default
pick, on adversarial groups: all codes equal, activations at +-127, codebooks at the
`check_codebook` limits, 1 and 2..17 activation rows, weight rows and fused parts that end
inside a 16-row block, thread splits that start inside one."""

from __future__ import annotations

import numpy as np
import pytest
import test_cq_int as base
from cq_helpers import pick_results
from kernel_helpers import variant_results

from needlepoint.kernels import exact, wtypes

F32 = np.float32
REV4 = [0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15]


def _nibbles(byte: int) -> int:
    """A code byte (code s in bits 2s, 2s + 1) as b0 | b1 << 4, bit s of b0 / b1 the low /
    high bit of code s."""
    b0 = sum(((byte >> (2 * s)) & 1) << s for s in range(4))
    b1 = sum(((byte >> (2 * s + 1)) & 1) << s for s in range(4))
    return b0 | b1 << 4


@pytest.mark.parametrize("use_native", [False, True])
def test_interleaved_copy_is_the_same_bytes_regrouped_by_register(use_native):
    """Byte i of lane L of register o of block b and group g is row 16 b + i's byte
    32 g + 16 L + rev4(o) as plane nibbles; rows past the end are code 0 (byte 0): the numpy
    reference and the native builder, codes given as a strided view (an archive slice)."""
    rng = np.random.default_rng(37)
    for rows, groups in ((1, 1), (16, 2), (21, 3)):
        wide = rng.integers(0, 256, (rows + 2, 32 * groups + 32)).astype(np.uint8)
        packed = wide[1 : rows + 1, 32:]
        got = exact.interleave_codes(packed, use_native)
        blocks = -(-rows // 16)
        assert got.shape == (blocks, 16 * 32 * groups) and got.dtype == np.uint8
        for b in range(blocks):
            for g in range(groups):
                for o in range(16):
                    for lane in range(2):
                        for i in range(16):
                            row, col = 16 * b + i, 32 * g + 16 * lane + REV4[o]
                            want = _nibbles(int(packed[row, col])) if row < rows else 0
                            at = ((g * 16 + o) * 2 + lane) * 16 + i
                            assert got[b, at] == want


def test_two_bit_records_carry_the_interleaved_layout_and_loads_build_it():
    """The CQ weight records name their layout; a load builds the interleaved copy for 2-bit
    storage (its bytes: the codes' rows padded to 16; 4-bit parts get the blocked copy,
    tests/kernels/test_cq_int4.py)."""
    layouts = {t.name: t.layout for t in wtypes.TYPES.values() if t.kind == "cq"}
    assert layouts == {"CQ1": exact.PACKED, "CQ2": exact.INTERLEAVED, "CQ3": exact.PACKED,
                       "CQ4": exact.BLOCKED, "CQT": exact.INTERLEAVED}
    for m in base._archive_matrices("tiny"):
        for p in m.parts:
            assert p.interleaved.nbytes == -(-p.rows // 16) * 16 * p.packed.shape[1]
            if m.storage_bits == 2:
                np.testing.assert_array_equal(p.interleaved,
                                              exact.interleave_codes_reference(p.packed))


def _cases() -> list:
    """(name, matrix without the copy, v, scale)."""
    cases = []
    rng = np.random.default_rng(3)
    for rows, groups, parts in ((1, 1, 1), (13, 2, 1), (16, 3, 1), (37, 6, 3), (33, 1, 2)):
        for book_name, book in (("real", base.REAL), ("edge", base.EDGE)):
            matrices = [("random", base._synthetic(rows, groups, book, rows, parts=parts))]
            matrices += [(f"all{c}", base._synthetic(rows, groups, book, c,
                                                     codes=np.full(128 * groups, c), parts=parts))
                         for c in range(4)]
            for tile in (1, 2, 3, 5, 16, 17):
                x = rng.standard_normal((tile, 128 * groups)).astype(F32)
                x[0] = np.where(np.arange(128 * groups) % 3, 1.0, -1.0)  # q = +-127
                if tile > 1:
                    x[1] = -1.0  # q = -127 everywhere
                v, scale = exact.a8_rotate(x, 128 * groups)
                for kind, m in matrices:
                    cases.append((f"{rows}r-{groups}g-{parts}p-{book_name}-{kind}-T{tile}", m,
                                  v, scale))
    return cases


def check_interleaved() -> dict:
    """Native vs reference in this process's variant: {case: equal} for the lookup kernel
    forced (pick 2) and the default pick (0), the copy present and absent, 1 and 3 threads, and
    the rows from a third of the way on alone."""
    return pick_results(_cases(), (2, 0),
                        lambda m: [(m.out // 3, m.out, 2), (m.out // 3, m.out, 0)])


@pytest.mark.parametrize("cap", ["0", "1", "best"])
def test_interleaved_lookups_give_the_reference_bits(cap):
    """Each variant in a fresh process (the library picks its variant once per process)."""
    results = variant_results(cap, "test_cq_interleaved", "check_interleaved()")
    variant = results.pop("variant")
    if cap == "0":
        assert variant == "baseline"
    elif cap == "1":
        assert variant == ("avx2+fma" if base._cpu_has_avx2() else "baseline")
    assert len(results) == 2 * 5 * 5 * 6 * 12
    assert [case for case, equal in results.items() if not equal] == []
