"""The table-lookup CQ x A8 kernel (kernels/native/np_cq_lut.h, issue 26 item 1): its algebra in
numpy (bit planes of the 2-bit codes, balanced base-16 digits of v, the int8 / int16 bounds the
kernel relies on, and the "Hadamard on the weights" identity the issue proposes for tiles), and
the same bits as the numpy reference (`exact.cq_matmul_reference`) in every compiled variant
(each in a fresh process), with the lookup kernel forced (`np_cq_kernel(2)`) and with the
default pick by row count: every Needle 3 fixture and the toy model (test_cq_int's cases), tiles
whose rows and weight rows leave tails of the kernel's 16-row blocks and activation sub-tiles,
activations at +-127, groups whose 128 codes are all equal, codebooks at the check_codebook
limit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from needlepoint.kernels import exact, native

F32 = np.float32
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import test_cq_int as base  # noqa: E402  (the shared cases: archives, adversarial groups)
from kernel_helpers import variant_results  # noqa: E402


def _digits(v: np.ndarray) -> list[np.ndarray]:
    """np_cq_lut.h's balanced base-16 digits: d0..d2 in [-8, 7], the rest d3."""
    u = v.astype(np.int64)
    out = []
    for _ in range(3):
        d = ((u + 8) & 15) - 8
        out.append(d)
        u = (u - d) >> 4
    return out + [u]


def _hadamard(n: int = 128) -> np.ndarray:
    h = np.array([[1]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def test_digits_cover_the_kernel_range_with_its_int8_and_int16_bounds():
    """Every v in [-2^14, 2^14) is d0 + 16 d1 + 256 d2 + 4096 d3 with d0..d2 in [-8, 7] and d3
    in [-4, 4]; a table entry (a sum of up to 4 digits) then lies in [-32, 28] ([-16, 16] for
    d3), four looked-up quads in [-128, 112] (an int8), a group's A = sum d0 + 16 sum d1 and
    B = sum d2 + 16 sum d3 within int16, and A + 256 B within int32."""
    v = np.arange(-16384, 16384)
    d = _digits(v)
    np.testing.assert_array_equal(d[0] + 16 * d[1] + 256 * d[2] + 4096 * d[3], v)
    for p in range(3):
        assert d[p].min() == -8 and d[p].max() == 7
    assert d[3].min() == -4 and d[3].max() == 4
    entry = [(4 * x.min(), 4 * x.max()) for x in d]
    assert entry[:3] == [(-32, 28)] * 3 and entry[3] == (-16, 16)
    assert 4 * entry[0][0] >= -128 and 4 * entry[0][1] <= 127  # four lookups in int8
    assert 4 * entry[3][0] >= -128 and 4 * entry[3][1] <= 127
    quads = 32  # a group: 32 quads of 4 columns
    a_peak = quads * 32 + 16 * quads * 32
    b_peak = quads * 32 + 16 * quads * 16
    assert a_peak < 2**15 and b_peak < 2**15
    assert a_peak + 256 * b_peak < 2**31


def test_bit_planes_and_the_hadamard_on_the_weights_give_the_level_sums():
    """S_j = sum of v over code j from the planes b0, b1, b0 & b1 (the lookup kernel's
    functionals, as digit-wise subset sums of quads), and S_j = (H m_j) . q with
    (H m_j)[k] in [-64, 64] for k > 0 and (H m_j)[0] the count of code j (issue 26), on 2,000
    random groups, all-equal groups (a count of 128) and activations at +-127."""
    rng = np.random.default_rng(26)
    h = _hadamard()
    for trial in range(2000):
        kind = trial % 5
        q = rng.integers(-128, 128, 128)
        if kind == 1:
            q = np.full(128, rng.choice([-127, 127]))
        elif kind == 2:
            q = np.where(rng.integers(0, 2, 128) > 0, 127, -127)
        idx = rng.integers(0, 4, 128) if kind != 3 else np.full(128, trial % 4)
        v = h @ q
        s = np.array([v[idx == j].sum() for j in range(4)])
        nibble = np.arange(16)
        bits = (nibble[:, None] >> np.arange(4)) & 1  # [16, 4]
        planes = (idx & 1, idx >> 1, (idx & 1) & (idx >> 1))
        sums = []
        for plane in planes:
            total = 0
            for p, dp in enumerate(_digits(v)):
                tables = bits @ dp.reshape(32, 4).T  # [16 entries, 32 quads]
                looked = tables[(plane.reshape(32, 4) << np.arange(4)).sum(1), np.arange(32)]
                total += int(looked.sum()) * 16**p
            sums.append(total)
        p0, p1, p01 = sums
        got = [int(v.sum()) - p0 - p1 + p01, p0 - p01, p1 - p01, p01]
        assert got == s.tolist()
        for j in range(4):
            hm = h @ (idx == j).astype(np.int64)
            assert hm[0] == (idx == j).sum() and np.abs(hm[1:]).max() <= 64
            assert int(hm @ q) == s[j]
        assert v.sum() == 128 * q[0]


def _extra_cases() -> list:
    """(name, matrix, v, scale): tiles past the 16-row blocks and the activation sub-tiles
    (NP_LUT_SUB: 128 / groups rows), activations at +-127, all-equal codes."""
    cases = []
    rng = np.random.default_rng(7)
    for rows, groups, tile in ((13, 1, 130), (37, 6, 23), (100, 3, 64), (16, 9, 17),
                               (33, 12, 11)):
        for name, book in (("real", base.REAL), ("edge", base.EDGE)):
            m = base._synthetic(rows, groups, book, seed=rows + groups)
            x = rng.standard_normal((tile, 128 * groups)).astype(F32)
            x[0] = 1.0  # q = +127 everywhere
            x[1 % tile] = -1.0  # q = -127 everywhere
            if tile > 2:
                x[2] = np.where(np.arange(128 * groups) % 3, 2.5, -2.5)  # +-127 mixed
            v, scale = exact.a8_rotate(x, 128 * groups)
            cases.append((f"tile{tile}-rows{rows}-{groups}g-{name}", m, v, scale))
            for code in range(4):
                same = base._synthetic(rows, groups, book, seed=code,
                                       codes=np.full(128 * groups, code))
                cases.append((f"tile{tile}-rows{rows}-{groups}g-{name}-all{code}", same, v, scale))
    return cases


def check_lookup(pick: int) -> dict:
    """Native vs reference with `np_cq_kernel(pick)` in this process's variant."""
    native.LIBRARY.np_cq_kernel(pick)
    results = base.check_everything()
    for name, m, v, scale in _extra_cases():
        want = exact.cq_matmul(v, scale, m, use_native=False)
        got = exact.cq_matmul(v, scale, m, use_native=True)
        results[name] = bool(np.array_equal(got, want) and np.isfinite(want).all())
    return results


@pytest.mark.parametrize("pick", [2, 0])
@pytest.mark.parametrize("cap", ["0", "1", "best"])
def test_lookup_kernel_gives_the_reference_bits(cap, pick):
    """Each variant in a fresh process (the library picks its variant once per process): the
    lookup kernel at every row count (pick 2) and the default pick by row count (pick 0)."""
    results = variant_results(cap, "test_cq_lut", f"check_lookup({pick})")
    variant = results.pop("variant")
    if cap == "0":
        assert variant == "baseline"
    elif cap == "1":
        assert variant == ("avx2+fma" if base._cpu_has_avx2() else "baseline")
    assert len(results) > 200
    assert [case for case, equal in results.items() if not equal] == []
