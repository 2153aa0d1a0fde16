"""The "Hadamard on the weights" kernel for 2-bit CQ x A8 tiles (kernels/native/np_cq_had.h,
AVX-512 VNNI, and np_cq_had2.h, AVX2; picked in np_cq_int.h np_cq_int, forced by
`np_cq_kernel(3)`): its algebra in numpy (u = H x + 64 in [0, 192] for a 0/1 plane x,
P_x = u . q - 64 sum q, H_128 = H_32 (x) H_4 with H_4 of a plane nibble as a table,
q = H v / 128; the AVX2 form's halved planes and int16 pair sums), and the same bits as the numpy
reference (`exact.cq_matmul_reference`) in a fresh process per variant, the kernel forced and
the default pick, on adversarial cases: all codes equal (each of 0..3), activations at +-127
(v at its extremes), codebooks at the `check_codebook` limits, 1..70 activation rows (the
kernel's 8 / 4 / 2 / 1-row tiles and 64-row passes), weight rows and fused parts that end
inside a 16-row block, row ranges that start and end inside one, the interleaved copy present
and absent, 1 and 3 threads, v = H q with q at +-127 and with some q = -128 (the AVX2 form
hands those back), and v that is not an A8 rotation or outside [-2^14, 2^14) (the kernel
hands back)."""

from __future__ import annotations

import numpy as np
import pytest
import test_cq_int as base
from cq_helpers import pick_results
from kernel_helpers import variant_results

from needlepoint.kernels import exact

F32 = np.float32


def _hadamard(n: int = 128) -> np.ndarray:
    h = np.array([[1]], np.int64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def test_planes_transformed_fit_u8_and_give_the_plane_sums():
    """For every 0/1 plane x: u = H x + 64 lies in [0, 192] (u_0 = 64 + sum x, the others in
    [0, 128]); P_x = x . v = u . q - 64 sum q for v = H q, with sum q = v_0 and
    |u . q| < 2^22; the S_j from the planes are the level sums. 2,000 random, all-equal and
    +-127 groups."""
    rng = np.random.default_rng(3)
    h = _hadamard()
    for trial in range(2000):
        q = rng.integers(-128, 128, 128)
        if trial % 4 == 1:
            q = np.full(128, rng.choice([-128, -127, 127]))
        elif trial % 4 == 2:
            q = 127 * h[rng.integers(0, 128)]  # v = 127 * 128 at one column: |v| at its peak
        idx = rng.integers(0, 4, 128) if trial % 5 else np.full(128, trial % 4)
        v = h @ q
        assert v[0] == q.sum() and v.sum() == 128 * q[0]
        assert np.array_equal(h @ v, 128 * q)  # q recovered exactly
        sums = []
        for x in (idx & 1, idx >> 1, (idx & 1) & (idx >> 1)):
            u = h @ x + 64
            assert 0 <= u.min() and u.max() <= 192 and u[0] == 64 + x.sum()
            assert np.abs(u[1:] - 64).max() <= 64
            r = int(u @ q)
            assert abs(r) < 2**22
            sums.append(r - 64 * int(v[0]))
            assert sums[-1] == int(x @ v)
        p0, p1, p01 = sums
        s = [int(v.sum()) - p0 - p1 + p01, p0 - p01, p1 - p01, p01]
        assert s == [int(v[idx == j].sum()) for j in range(4)]


def test_the_transform_is_a_nibble_table_then_five_byte_butterflies():
    """H_128 = H_32 (x) H_4 over k = 4 k4 + j; H_4 of a quad's plane nibble is the kernel's
    16-dword table (byte j = sum_s (-1)^popcount(j & s) bit s); the 32-quad butterflies on
    bytes that wrap modulo 256 give the exact u in [0, 192]."""
    h = _hadamard()
    assert np.array_equal(h, np.kron(_hadamard(32), _hadamard(4)))
    table = np.array([[sum((-1) ** bin(j & s).count("1") for s in range(4) if n >> s & 1)
                       for j in range(4)] for n in range(16)])
    bits = (np.arange(16)[:, None] >> np.arange(4)) & 1
    assert np.array_equal(table, bits @ _hadamard(4))
    rng = np.random.default_rng(5)
    for trial in range(500):
        x = rng.integers(0, 2, 128) if trial % 3 else np.full(128, trial % 2)
        nibbles = (x.reshape(32, 4) << np.arange(4)).sum(1)
        y = table[nibbles].astype(np.uint8, casting="unsafe")  # [quad, j] as wrapped bytes
        y[0] += 64  # H (64 e_0) = 64 everywhere
        half = 1
        while half < 32:
            view = y.reshape(-1, 2, half, 4)
            a, b = view[:, 0].copy(), view[:, 1].copy()
            view[:, 0], view[:, 1] = a + b, a - b  # uint8: modulo 256
            half *= 2
        assert np.array_equal(y.reshape(128).astype(np.int64), h @ x + 64)


def test_the_avx2_form_halves_the_planes_and_no_int16_sum_saturates():
    """np_cq_had2.h: u_0 = (H x)_0 and u_k = (H x)_k + 64 (k > 0) lie in [0, 128] and all have
    the parity p of sum x, so u' = u >> 1 in [0, 64] and P_x = 2 u' . q + p v_0 - 64 (v_0 - q_0);
    the kernel's int16 lanes (vpmaddubsw pairs of adjacent columns, two of them added: columns
    4 k4 + {0, 1} and 4 k4 + 4 + {0, 1}, or + {2, 3}, k4 even) stay within 32512 for q in
    [-127, 127]. 2,000 random, all-equal, Walsh-row and +-127 groups."""
    rng = np.random.default_rng(7)
    h = _hadamard()
    for trial in range(2000):
        q = rng.integers(-127, 128, 128)
        if trial % 4 == 1:
            q = np.full(128, rng.choice([-127, 127]))
        elif trial % 4 == 2:
            q = rng.choice([-127, 127], 128)
        idx = rng.integers(0, 4, 128) if trial % 5 else np.full(128, trial % 4)
        if trial % 7 == 3:  # a plane equal to a Walsh row's + entries: (H x)_k = 64
            idx = np.where(h[rng.integers(1, 128)] > 0, 3, 0)
        v = h @ q
        for x in (idx & 1, idx >> 1, (idx & 1) & (idx >> 1)):
            hx = h @ x
            u = hx + 64
            u[0] = hx[0]
            assert 0 <= u.min() and u.max() <= 128
            p = int(x.sum()) & 1
            assert (u & 1 == p).all()
            half = u >> 1
            assert half.max() <= 64
            assert 2 * int(half @ q) + p * int(v[0]) - 64 * (int(v[0]) - int(q[0])) == x @ v
            pairs = (half * q).reshape(32, 2, 2)  # [quad, pair, column in pair]
            sums = pairs.sum(2).reshape(16, 2, 2).sum(1)  # quads k4, k4 + 1 added, k4 even
            assert np.abs(pairs.sum(2)).max() <= 32512 and np.abs(sums).max() <= 32512


def _activations(rng, rows: int, groups: int) -> list:
    """(name, v, scale): A8 rotations with q at +-127 (all equal, alternating, Walsh rows: v at
    its extremes), random ones, and v that is not an A8 rotation (q = H v / 128 not int8)."""
    cols = 128 * groups
    h = _hadamard()
    x = rng.standard_normal((rows, cols)).astype(F32)
    x[0] = np.where(np.arange(cols) % 3, 1.0, -1.0)
    if rows > 1:
        x[1] = -1.0  # q = -127 everywhere: v_0 = -16256
    if rows > 2:
        x[2] = 1.0
    for t in range(3, min(rows, 8)):
        x[t] = np.tile(h[(37 * t) % 128], groups).astype(F32)  # v = +-16256 at one column
    v, scale = exact.a8_rotate(x, cols)
    out = [("a8", v, scale)]
    if rows in (1, 5, 17):
        q = rng.integers(-128, 128, (rows, groups, 128))
        out.append(("hq", np.ascontiguousarray((q @ h).reshape(rows, cols).astype(np.int32)),
                    scale))
        q = rng.choice([-127, 127], (rows, groups, 128))  # the AVX2 form's extremes
        out.append(("hq127", np.ascontiguousarray((q @ h).reshape(rows, cols).astype(np.int32)),
                    scale))
        q = rng.integers(-127, 128, (rows, groups, 128))
        q[-1, -1, rng.integers(0, 128, 3)] = -128  # the AVX2 form hands back, VNNI takes it
        out.append(("hq-128", np.ascontiguousarray((q @ h).reshape(rows, cols).astype(np.int32)),
                    scale))
        odd = rng.integers(-16384, 16384, (rows, cols)).astype(np.int32)
        out.append(("not-a8", odd, scale))
        wide = v.copy()
        wide[-1, -1] = 16384  # outside [-2^14, 2^14): every integer kernel hands back
        out.append(("wide", wide, scale))
    return out


def _cases() -> list:
    """(name, matrix without the copy, v, scale)."""
    cases = []
    rng = np.random.default_rng(11)
    shapes = [((37, 3, 3), range(1, 71))]
    shapes += [(s, (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65, 70))
               for s in ((1, 1, 1), (13, 2, 1), (16, 1, 1), (33, 2, 2), (70, 1, 4))]
    for (rows, groups, parts), tiles in shapes:
        for book_name, book in (("real", base.REAL), ("edge", base.EDGE)):
            matrices = [("random", base._synthetic(rows, groups, book, rows, parts=parts))]
            if rows != 37 or book_name == "edge":
                matrices += [(f"all{c}", base._synthetic(rows, groups, book, c, parts=parts,
                                                         codes=np.full(128 * groups, c)))
                             for c in range(4)]
            for tile in tiles:
                for act, v, scale in _activations(rng, tile, groups):
                    for kind, m in matrices:
                        if kind != "random" and tile not in (1, 4, 9, 17, 70):
                            continue
                        cases.append((f"{rows}r-{groups}g-{parts}p-{book_name}-{kind}-T{tile}-"
                                      f"{act}", m, v, scale))
    return cases


def check_hadamard() -> dict:
    """Native vs reference in this process's variant: {case: equal} for the transform on the
    weights forced (pick 3) and the default pick (0), the copy present and absent, 1 and 3
    threads, and a row range that starts and ends inside 16-row blocks."""
    return pick_results(_cases(), (3, 0), lambda m: [(m.out // 3, m.out - m.out // 5, 3)])


@pytest.mark.parametrize("cap", ["1", "best"])
def test_the_transform_on_the_weights_gives_the_reference_bits(cap):
    """Each variant in a fresh process (the library picks its variant once per process): the
    VNNI form ("best" where the CPU has it) and, with the AVX2 cap, the AVX2 form (np_cq_had2.h),
    each forced (pick 3) and by the default pick (0); on the baseline pick 3 is the default
    pick, whose bits are checked too."""
    if cap == "best" and not base._cpu_has_vnni():
        pytest.skip("no AVX-512 VNNI on this CPU: the kernel is not compiled in for it")
    results = variant_results(cap, "test_cq_had", "check_hadamard()")
    variant = results.pop("variant")
    if cap == "best":
        assert variant == "avx512vnni"
    else:
        assert variant == ("avx2+fma" if base._cpu_has_avx2() else "baseline")
    assert len(results) > 1000
    assert [case for case, equal in results.items() if not equal] == []
