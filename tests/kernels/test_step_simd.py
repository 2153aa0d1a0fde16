"""The decode step's SIMD helpers (np_exp32_array eight lanes at a time, the A8 peak and the
128-wide integer Walsh-Hadamard in registers) against the numpy references, in every
instruction-set variant this CPU runs, with the lanes that leave the vector path (out of
range, NaN, inf) placed inside full vector blocks and in the tails."""

from __future__ import annotations

import numpy as np
import pytest

from needlepoint.errors import NonFiniteActivationError
from needlepoint.kernels import exact, native, pinned

F32 = np.float32
LIB = native.LIBRARY


@pytest.fixture(params=[0, 1, 2])
def variant(request):
    assert LIB is not None, "the native library is part of the build"
    before = LIB.np_simd_variant()
    yield LIB.np_force_variant(request.param)
    LIB.np_force_variant(before)


def test_exp32_array_equals_reference_in_every_variant(variant):
    rng = np.random.default_rng(5)
    edges = [-745.5, -745.0, -720.0, -700.0001, -700.0, 700.0, 700.5, 709.0, 709.5, 88.7,
             -103.9, np.inf, -np.inf, np.nan, 0.0, -0.0]
    x = rng.uniform(-120, 90, 4099).astype(F32)
    spots = rng.choice(x.size, size=len(edges), replace=False)
    x[spots] = np.array(edges, F32)
    x[-3:] = np.array([np.nan, 800.0, -800.0], F32)  # the scalar tail too
    ours = pinned.exp32(x, use_native=True)
    np.testing.assert_array_equal(ours, pinned.exp32_reference(x))
    assert np.isnan(ours[spots[edges.index(np.nan)]])


@pytest.mark.parametrize("cols,in_pad", [(768, 768), (3072, 3072), (100, 128), (7, 256)])
def test_a8_rotate_equals_reference_in_every_variant(variant, cols, in_pad):
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((3, cols)) * rng.uniform(0.01, 40, (3, 1))).astype(F32)
    x[1, rng.integers(0, cols)] = -1e30  # the peak inside a vector block or the tail
    x[2] = 0.0
    v, scale = exact.a8_rotate(x, in_pad, use_native=True)
    v_ref, scale_ref = exact.a8_rotate_reference(x, in_pad)
    np.testing.assert_array_equal(scale, scale_ref)
    np.testing.assert_array_equal(v, v_ref)
    codes, cscale = exact.a8_codes(x, use_native=True)
    codes_ref, cscale_ref = exact.a8_codes_reference(x)
    np.testing.assert_array_equal(codes, codes_ref)
    np.testing.assert_array_equal(cscale, cscale_ref)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 9, 766, 767])
def test_a8_non_finite_is_caught_in_every_lane(variant, bad, where):
    x = np.ones((2, 768), F32)
    x[1, where] = bad
    with pytest.raises(NonFiniteActivationError):
        exact.a8_rotate(x, 768, use_native=True)
    with pytest.raises(NonFiniteActivationError):
        exact.a8_codes(x, use_native=True)
