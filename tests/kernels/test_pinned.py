"""Pinned-order float kernels (`kernels.pinned`, docs/numerics.md): native and numpy reference
give the same bits, rows do not depend on the batch, and the pinned definitions mean what
they say (sequential sums, a correctly behaved exp, the fixtures' dequantisation order)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from cact_helpers import cq_samples
from conftest import NEEDLE3_FIXTURES, get_fixture

from needlepoint import open_archive
from needlepoint.kernels import hadamard_matrix, native, pinned
from needlepoint.kernels.cq import rotated_weights

F32 = np.float32


def test_matmul_seq_native_equals_reference_and_is_sequential():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((11, 37)).astype(F32)
    w = rng.standard_normal((37, 13)).astype(F32)
    out = pinned.matmul_seq(x, w, use_native=True)
    np.testing.assert_array_equal(out, pinned.matmul_seq(x, w, use_native=False))
    # the definition, one output by hand
    acc = F32(0.0)
    for k in range(37):
        acc = F32(acc + F32(x[4, k] * w[k, 6]))
    assert out[4, 6] == acc
    np.testing.assert_array_equal(pinned.matmul_seq(x[4:5], w)[0], out[4])


def test_exp32_native_equals_reference_and_is_accurate():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.uniform(-100, 80, 20000), rng.uniform(-1, 1, 5000), [0.0, -0.0, 1.0, -87.0, 88.0]
    ]).astype(F32)
    ours = pinned.exp32(x)
    lib = native.LIBRARY
    assert lib is not None
    by_c = np.array([lib.np_exp32(float(v)) for v in x[:3000]], F32)
    np.testing.assert_array_equal(ours[:3000], by_c)
    exact = np.array([math.exp(float(v)) for v in x])
    normal = exact > 1.2e-38
    rel = np.abs(ours[normal].astype(np.float64) - exact[normal]) / exact[normal]
    assert rel.max() < 1.2e-7  # within one float32 ulp
    assert pinned.exp32(np.array([0.0], F32))[0] == 1.0


def _attention_case(seed: int):
    rng = np.random.default_rng(seed)
    q, qk, vd, slots = 7, 16, 24, 50
    return dict(
        qcode=rng.integers(-128, 128, (q, qk)).astype(np.int8),
        qscale=rng.uniform(0.001, 0.1, q).astype(F32),
        kcode=rng.integers(-128, 128, (slots, qk)).astype(np.int8),
        kscale=rng.uniform(0.001, 0.1, slots).astype(F32),
        vcode=rng.integers(-128, 128, (slots, vd)).astype(np.int8),
        vscale=rng.uniform(0.001, 0.1, slots).astype(F32),
        slots=np.stack([rng.permutation(slots) for _ in range(q)]),
        count=rng.integers(1, slots + 1, q),
    )


def test_attend_native_equals_reference():
    case = _attention_case(3)
    np.testing.assert_array_equal(pinned.attend(**case, use_native=True),
                                  pinned.attend(**case, use_native=False))


def test_attend_is_softmax_attention_and_row_independent():
    case = _attention_case(4)
    out = pinned.attend(**case)
    for i in (0, 3, 6):
        keep = case["slots"][i, : case["count"][i]]
        q = case["qcode"][i].astype(np.float64) * case["qscale"][i]
        k = case["kcode"][keep].astype(np.float64) * case["kscale"][keep, None]
        v = case["vcode"][keep].astype(np.float64) * case["vscale"][keep, None]
        scores = k @ q / math.sqrt(16)
        p = np.exp(scores - scores.max())
        expected = (p / p.sum()) @ v
        np.testing.assert_allclose(out[i], expected, rtol=1e-4, atol=1e-5)
        single = {**case, "qcode": case["qcode"][i : i + 1], "qscale": case["qscale"][i : i + 1],
                  "slots": case["slots"][i : i + 1], "count": case["count"][i : i + 1]}
        np.testing.assert_array_equal(pinned.attend(**single)[0], out[i])


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_dequantisation_reproduces_every_fixture_sample(name):
    """The `deq_*` samples bit for bit, native and reference, on any machine (BLAS's own order
    differs between CPUs: a plain `R @ H` matched on some machines and not on others)."""
    fixture = get_fixture("needle3", name)
    archive = open_archive(fixture.cact)
    h = float(hadamard_matrix(128)[0, 0])
    checked = 0
    for key, tensor, rows in cq_samples(fixture, archive):
        cq = archive.cq(tensor)
        rotated = rotated_weights(cq, slice(0, rows) if rows else None)
        grouped = rotated.reshape(rotated.shape[0], -1, 128)
        for use_native in (True, False):
            got = pinned.dequant_rows(grouped, h, use_native)[:, : cq.cols]
            np.testing.assert_array_equal(got, fixture.arrays[key], err_msg=f"{key} {use_native}")
        checked += 1
    assert checked >= 4


def test_fused_multiply_add_emulation_is_correctly_rounded():
    """`_fma32` (the reference's fused multiply-add) is within half a float32 ulp of the
    exact a*b + c, computed in rational arithmetic."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal(4000).astype(F32)
    b = rng.standard_normal(4000).astype(F32)
    c = (rng.standard_normal(4000) * 10.0 ** rng.integers(-8, 8, 4000)).astype(F32)
    got = pinned._fma32(a, b, c)
    for i in range(0, 4000, 37):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        half_ulp = Fraction(float(np.spacing(np.abs(got[i])))) / 2
        assert abs(Fraction(float(got[i])) - exact) <= half_ulp
