"""The AVX-512 lookup path that takes two full 16-row blocks per zmm register
(kernels/native/np_cq_lut.h np_lut_group2, taken by np_cq_lut2 with the interleaved copy; the
default pick runs it at one activation row) against the numpy reference
(`exact.cq_matmul_reference`) bit for bit, in the AVX-512 VNNI variant in a fresh process:
the default pick, the lookups forced (`np_cq_kernel(2)`) and the one-block form forced
(`np_cq_kernel(5)`), on all codes equal (0..3), activations at +-127, codebooks at the
`check_codebook` limits, 31..70 weight rows in 1-3 parts (two full blocks, one, a tail), 1-3
activation rows, row ranges that start and end inside a 16-row block, 1 and 3 threads, the
copy present and absent."""

from __future__ import annotations

import numpy as np
import pytest
import test_cq_int as base
from cq_helpers import pick_results
from kernel_helpers import variant_results

from needlepoint.kernels import exact

F32 = np.float32
ROWS = (31, 32, 33, 48, 64, 70)
GROUPS = 2
# the default (two blocks where they fit at one activation row), the lookups forced (two
# blocks at every row count), the one-block form forced
PICKS = (0, 2, 5)


def _activations() -> list:
    """(name, v, scale): one activation row at +-127 alternating, -127 everywhere, random, and
    the three as a tile of 3 rows (the first two as one of 2)."""
    cols = 128 * GROUPS
    rng = np.random.default_rng(11)
    rows = {"pm127": np.where(np.arange(cols) % 3, 1.0, -1.0).astype(F32),
            "m127": np.full(cols, -1.0, F32),
            "random": rng.standard_normal(cols).astype(F32)}
    tiles = {name: x[None, :] for name, x in rows.items()}
    tiles["T2"] = np.stack([rows["pm127"], rows["m127"]])
    tiles["T3"] = np.stack(list(rows.values()))
    return [(name, *exact.a8_rotate(x, cols)) for name, x in tiles.items()]


def _matrices() -> list:
    """(name, matrix without the copy)."""
    out = []
    for rows in ROWS:
        for parts in (1, 2, 3):
            for book_name, book in (("real", base.REAL), ("edge", base.EDGE)):
                tag = f"{rows}r-{parts}p-{book_name}"
                out.append((f"{tag}-random", base._synthetic(rows, GROUPS, book, rows,
                                                              parts=parts)))
                out += [(f"{tag}-all{c}", base._synthetic(rows, GROUPS, book, c,
                                                          codes=np.full(128 * GROUPS, c),
                                                          parts=parts))
                        for c in range(4)]
    return out


def _ranges(out: int) -> list:
    """Row ranges [lo, hi) that start and end inside 16-row blocks (and the whole)."""
    return [(lo, hi) for lo, hi in ((3, out - 5), (17, out), (0, out - 1), (5, 37))
            if 0 <= lo < hi <= out]


def check_two_blocks() -> dict:
    """{case: equal} in this process's variant, for picks 0, 2 and 5."""
    acts = _activations()
    cases = ((f"{name}-{act}", m, v, scale) for name, m in _matrices() for act, v, scale in acts)
    return pick_results(cases, PICKS,
                        lambda m: [(lo, hi, pick) for lo, hi in _ranges(m.out) for pick in PICKS])


def _expected_count() -> int:
    per_matrix = sum(2 * (2 * len(PICKS) + len(_ranges(rows)) * len(PICKS)) for rows in ROWS)
    return per_matrix * 3 * 2 * 5 * 5  # parts, codebooks, code kinds, activations


def test_two_block_lookups_give_the_reference_bits():
    """The VNNI variant in a fresh process (the library picks its variant once per process)."""
    if not base._cpu_has_vnni():
        pytest.skip("no AVX-512 VNNI on this CPU: the two-block path is not compiled in for it")
    results = variant_results("best", "test_cq_lut512", "check_two_blocks()")
    assert results.pop("variant") == "avx512vnni"
    assert len(results) == _expected_count()
    assert [case for case, equal in results.items() if not equal] == []
