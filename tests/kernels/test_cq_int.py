"""The integer CQ x A8 kernels (kernels/native/np_cq_int.h, level sums, 2-bit decode rows;
np_cq_int16.h, 16-bit digits, 4-bit storage and 2-bit prefill tiles; AVX2 and AVX-512 VNNI;
the float64 kernel in the baseline variant): the same bits as
the numpy reference (`exact.cq_matmul_reference`) in every compiled variant (baseline, AVX2,
AVX-512 VNNI where the CPU has it), on every Needle 3 fixture and the toy model, and on
adversarial inputs: activations at the ends of the range the byte split covers (and outside
it, where the float64 kernel takes over), codebooks at the edge of what `check_codebook`
accepts, odd group counts, row counts and activation tiles that leave tails, fused parts and
thread splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import get_fixture, toy_model_path
from kernel_helpers import variant_results

from needlepoint import open_archive
from needlepoint.kernels import exact, native

F32 = np.float32
# rows of activations: decode (1, 2: level sums on AVX-512), digit tiles of 4 and their tails
ROWS = (1, 2, 3, 4, 5, 9)
# 2-bit products of every width the archives have (1 to 6 groups) and, per archive, a 4-bit one
ARCHIVE_PARTS = {
    "tiny": ["layer00.q_proj", "layer00.k_proj", "layer00.v_proj", "layer00.gate_proj"],
    "small": ["layer01.out_proj"],
    "shipped": ["layer03.q_proj", "layer07.k_proj", "layer07.out_proj"],
    "toy": ["layer00.q_proj", "layer01.out_proj"],
}


def _archive_path(name: str) -> str:
    return str(toy_model_path() if name == "toy" else get_fixture("needle3", name).cact)


def _archive_matrices(name: str) -> list[exact.ExactMatrix]:
    archive = open_archive(_archive_path(name))
    out = []
    for part in ARCHIVE_PARTS[name]:
        cq = archive.cq(part)
        out += exact.exact_matrices([(cq, 0, cq.rows)])
    cq = archive.cq("embedding")  # 4-bit
    out += exact.exact_matrices([(cq, 0, min(cq.rows, 300))])
    return out


def _synthetic(rows: int, groups: int, codebook, seed: int, codes=None, parts: int = 1):
    """An ExactMatrix of random (or given) codes (2-bit for 4 levels, else 4-bit) and norms,
    split into `parts` parts."""
    rng = np.random.default_rng(seed)
    in_pad = 128 * groups
    codebook = np.asarray(codebook, F32)
    bits = 2 if codebook.size <= 4 else 4
    if codes is None:
        codes = rng.integers(0, 1 << bits, (rows, in_pad))
    codes = np.broadcast_to(codes, (rows, in_pad)).astype(np.uint8)
    if bits == 2:
        packed = codes[:, 0::4] | codes[:, 1::4] << 2 | codes[:, 2::4] << 4 | codes[:, 3::4] << 6
    else:
        packed = codes[:, 0::2] | codes[:, 1::2] << 4
    norms = rng.uniform(0.01, 2.0, (rows, groups)).astype(F32)
    cuts = np.linspace(0, rows, parts + 1).astype(int)
    pieces = tuple(
        exact.ExactPart(np.ascontiguousarray(packed[a:b]), np.ascontiguousarray(norms[a:b]),
                        int(a))
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    )
    exact.check_codebook(codebook)
    return exact.ExactMatrix(in_pad, in_pad, rows, bits, codebook, pieces)


REAL = [-0.13317214, -0.03990209, 0.04003528, 0.13346045]  # the fixtures' 2-bit codebook
# the widest level spread check_codebook accepts: max / quantum = 2^32 - 2^8 (quantum 2^-31)
EDGE = [-1.0, -0.0068359375, 0.00390625, 0.99999994]
# 4-bit: the fixtures' embedding codebook (16 levels, integer levels up to 2^28), the widest
# spread (five bytes of k - min k), one with zeros and a subnormal level, all levels equal
REAL16 = np.linspace(-0.23953155, 0.2438, 16).astype(F32).tolist()
EDGE16 = [-1.0, -0.99999994, -0.5, -0.25, -0.0068359375, 0.0, 0.00390625, 0.0078125, 0.125,
          0.2, 0.3, 0.4, 0.5, 0.75, 0.9, 0.99999994]
TINY16 = [0.0] * 8 + [1e-45, 2e-45, 0.0, 3e-45, 0.0, 0.0, 4e-45, 0.0]
FLAT16 = [0.0625] * 16
# The digit kernel cuts (k - kc) / gcd into balanced base-2^14 digits (np_cq_int16.h): INT16 and
# WIDE16 (spread 3 * 2^31 quanta, gcd 2^23) take one, EDGE16 two, REAL16 three
INT16 = [j / 64 for j in range(-8, 8)]
WIDE16 = [-1.5, -1.0, -0.5, -0.25, -0.125, -0.0625, 0.0, 0.00390625, 0.0078125, 0.125, 0.25,
          0.5, 0.75, 1.0, 1.25, 1.5]


def _adversarial_cases():
    """(name, matrix, v int32 [T, in_pad], scale [T]) at and beyond the overflow bounds."""
    cases = []
    books = (("real", REAL), ("edge", EDGE), ("real16", REAL16), ("edge16", EDGE16),
             ("tiny16", TINY16), ("flat16", FLAT16), ("int16", INT16), ("wide16", WIDE16))
    for groups in (1, 3, 6, 9, 24):
        for codebook_name, codebook in books:
            m = _synthetic(13, groups, codebook, seed=groups)
            rng = np.random.default_rng(groups)
            in_pad = 128 * groups
            extremes = [
                np.full(in_pad, -16384), np.full(in_pad, 16383),
                np.where(np.arange(in_pad) % 2, 16383, -16384),
                rng.integers(-16384, 16384, in_pad),
                np.zeros(in_pad, int),
            ]
            v = np.stack(extremes).astype(np.int32)
            scale = rng.uniform(1e-3, 10, len(v)).astype(F32)
            cases.append((f"{groups}g-{codebook_name}-extremes", m, v, scale))
            for code in range(len(codebook)):  # every code the same: one level carries all
                same = _synthetic(5, groups, codebook, seed=code, codes=np.full(in_pad, code))
                cases.append((f"{groups}g-{codebook_name}-all{code}", same, v, scale))
    # outside the byte split's range: the float64 kernel (exact for any int32) runs instead
    v = np.array([np.full(256, 16384), np.full(256, -16385), np.full(256, 1 << 20)], np.int32)
    for codebook in (REAL, REAL16):
        m = _synthetic(11, 2, codebook, seed=5)
        cases.append((f"out-of-range-{len(codebook)}", m, v, np.ones(3, F32)))
    # fused parts: rows of several parts in one product
    m = _synthetic(23, 6, REAL, seed=9, parts=3)
    rng = np.random.default_rng(9)
    v, scale = exact.a8_rotate((rng.standard_normal((7, 768)) * 4).astype(F32), 768)
    cases.append(("fused-parts", m, v, scale))
    return cases


def check_everything() -> dict:
    """Native vs numpy reference on every case in this process's variant: {case: equal}."""
    results = {"variant": native.simd_variant()}
    for name in ARCHIVE_PARTS:
        for m in _archive_matrices(name):
            rng = np.random.default_rng(m.out)
            for rows in ROWS:
                x = rng.standard_normal((rows, m.cols)).astype(F32)
                x *= rng.uniform(0.01, 30, (rows, 1)).astype(F32)
                x[0, : m.cols // 2] = 0.0
                v, scale = exact.a8_rotate(x, m.in_pad)
                got = exact.cq_matmul(v, scale, m, use_native=True)
                want = exact.cq_matmul(v, scale, m, use_native=False)
                results[f"{name}-{m.storage_bits}bit-{m.out}x{m.in_pad}-T{rows}"] = bool(
                    np.array_equal(got, want))
    for case, m, v, scale in _adversarial_cases():
        got = exact.cq_matmul(v, scale, m, use_native=True)
        want = exact.cq_matmul(v, scale, m, use_native=False)
        results[case] = bool(np.array_equal(got, want) and np.isfinite(want).all())
        for threads in (2, 3):  # rows split between threads: whole outputs per thread
            split = exact.ExactMatrix(m.cols, m.in_pad, m.out, m.storage_bits, m.codebook,
                                      m.parts, threads)
            results[f"{case}-threads{threads}"] = bool(
                np.array_equal(exact.cq_matmul(v, scale, split, use_native=True), want))
    return results


def _cpu_has_vnni() -> bool:
    flags = Path("/proc/cpuinfo").read_text().split()
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"))


def _cpu_has_avx2() -> bool:
    flags = Path("/proc/cpuinfo").read_text().split()
    return "avx2" in flags and "fma" in flags


def test_the_integer_kernel_is_built():
    assert native.LIBRARY is not None, native.UNAVAILABLE_REASON
    assert native.simd_variant() in native.VARIANTS


@pytest.mark.parametrize("cap", ["0", "1", "best"])
def test_every_variant_gives_the_reference_bits(cap):
    """Each variant in a fresh process (the C library picks its variant once per process);
    `best` is what the CPU supports: AVX-512 VNNI where present (this checks it runs there)."""
    results = variant_results(cap, "test_cq_int", "check_everything()")
    variant = results.pop("variant")
    if cap == "0":
        assert variant == "baseline"
    elif cap == "1":
        assert variant == ("avx2+fma" if _cpu_has_avx2() else "baseline")
    else:
        best = "avx2+fma" if _cpu_has_avx2() else "baseline"
        assert variant == ("avx512vnni" if _cpu_has_vnni() else best)
    assert len(results) > 150
    assert [case for case, equal in results.items() if not equal] == []


def test_edge_codebook_is_at_the_check_codebook_bound():
    """EDGE really is the extreme: one more binary order of spread is refused."""
    exact.check_codebook(np.asarray(EDGE, F32))
    with pytest.raises(exact.ExactEngineError):
        exact.check_codebook(np.asarray([-2.0, -0.0068359375, 0.00390625, 1.0], F32))


def test_level_sums_are_what_the_reference_multiplies():
    """The integer regrouping itself, in numpy: sum_c cb[idx_c] v_c == sum_j cb[j] S_j for
    the adversarial extremes, with the S_j from the three functionals the kernel computes."""
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 4, (50, 128))
    v = rng.integers(-16384, 16384, (50, 128))
    v[0], v[1] = -16384, 16383
    fa = (idx * v).sum(1)
    fb = ((idx >= 2) * v).sum(1)
    fc = ((idx == 3) * v).sum(1)
    s3, s2 = fc, fb - fc
    s1 = fa - 2 * s2 - 3 * s3
    s0 = v.sum(1) - s1 - s2 - s3
    for j, s in enumerate((s0, s1, s2, s3)):
        np.testing.assert_array_equal(s, (v * (idx == j)).sum(1))
    assert np.abs(np.stack([s0, s1, s2, s3])).max() < 2**21


def _balanced_digits(u: int) -> list[int]:
    """np_cq_int16.h's digits of u in base 2^14, each in [-8191, 8192] (three of them)."""
    out = []
    for _ in range(3):
        d = ((u + 8191) & 16383) - 8191
        out.append(d)
        u = (u - d) >> 14
    assert u == 0
    return out


def test_16bit_digits_are_exact():
    """np_cq_int16.h's regrouping in Python integers: sum_c k[idx_c] v_c == gc * W + kc * tot
    with W from balanced base-2^14 digits of (k - kc) / gc, and an int32 lane (16 products of a
    digit and v) stays in [-2^31, 2^31), at the extremes of v, for codebooks of one, two and
    three digits and the widest spread (WIDE16)."""
    rng = np.random.default_rng(3)
    for codebook in (INT16, EDGE16, REAL16, WIDE16):
        cb = np.asarray(codebook, F32).astype(np.float64)
        quantum = 2.0 ** (np.frexp(np.abs(cb[cb != 0]))[1].min() - 24)
        k = [int(x) for x in cb / quantum]
        assert all(float(x) * quantum == c for x, c in zip(k, cb, strict=True))
        kmin, kmax = min(k), max(k)
        gc = int(np.gcd.reduce([x - kmin for x in k])) or 1
        kc = kmin + gc * ((kmax - kmin) // gc // 2)
        digits = [_balanced_digits((x - kc) // gc) for x in k]
        assert all(-8191 <= d <= 8192 for ds in digits for d in ds)
        for v in (np.full(128, -16384), np.full(128, 16383), rng.integers(-16384, 16384, 128)):
            for idx in (rng.integers(0, 16, 128), np.full(128, int(np.argmin(k))),
                        np.full(128, int(np.argmax(k)))):
                vs = [int(x) for x in v]
                parts = [sum(digits[i][p] * x for i, x in zip(idx, vs, strict=True))
                         for p in range(3)]
                w = sum(2 ** (14 * p) * parts[p] for p in range(3))
                want = sum(k[i] * x for i, x in zip(idx, vs, strict=True))
                assert gc * w + kc * sum(vs) == want
                assert abs(gc * w) < 2**53 and abs(kc * sum(vs)) < 2**53
                for p in range(3):  # one lane: 16 products of the group
                    lane = sum(digits[i][p] * x for i, x in zip(idx[:16], vs[:16], strict=True))
                    assert -(2**31) <= lane < 2**31
