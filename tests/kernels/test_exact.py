"""Exact CQ x A8 products (`kernels.exact`, docs/numerics.md): the native kernel and the numpy
reference give the same bits; the result equals the mathematically exact product rounded
once (checked in rational arithmetic); rows are independent of the batch they come in."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from conftest import get_fixture

from needlepoint import open_archive
from needlepoint.errors import NonFiniteActivationError
from needlepoint.kernels import exact, native
from needlepoint.kernels.cq import dequantize
from needlepoint.models.ops import fake_quant_a8

F32 = np.float32


def test_native_kernels_are_built():
    """`pip install -e .` builds the C kernels on this machine (a compiler is present)."""
    assert native.LIBRARY is not None, native.UNAVAILABLE_REASON
    assert native.simd_variant() in native.VARIANTS


def _matrices(name: str, parts: list[str]):
    archive = open_archive(get_fixture("needle3", name).cact)
    pieces = [(archive.cq(p), 0, archive.cq(p).rows) for p in parts]
    return archive, exact.exact_matrices(pieces)


@pytest.mark.parametrize(
    "name,parts",
    [
        ("tiny", ["layer00.q_proj", "layer00.k_proj", "layer00.v_proj", "layer00.gate_proj"]),
        ("small", ["layer01.out_proj"]),
        ("small", ["mhc_phi_pre", "mhc_phi_res"]),  # 4-bit, 1536 wide, few rows: direct path
        ("tiny", ["embedding"]),  # 4-bit, many rows: the byte-table path
    ],
)
def test_native_equals_reference(name, parts):
    _, matrices = _matrices(name, parts)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((9, matrices[0].cols)) * rng.uniform(0.01, 30, (9, 1))).astype(F32)
    x[3] = 0.0  # an all-zero row: scale 1, every code 0
    native_out = exact.a8_product(x, matrices, use_native=True)
    reference = exact.a8_product(x, matrices, use_native=False)
    assert native_out.dtype == F32 and native_out.shape == (9, matrices[0].out)
    np.testing.assert_array_equal(native_out, reference)
    assert not native_out[3].any()


@pytest.mark.parametrize("use_native", [True, False])
def test_rows_do_not_depend_on_the_batch(use_native):
    _, matrices = _matrices("small", ["layer00.q_proj", "layer00.k_proj"])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((17, matrices[0].cols)).astype(F32)
    together = exact.a8_product(x, matrices, use_native)
    for row in (0, 5, 16):
        alone = exact.a8_product(x[row : row + 1], matrices, use_native)
        np.testing.assert_array_equal(alone[0], together[row])
    np.testing.assert_array_equal(exact.a8_product(x[4:11], matrices, use_native), together[4:11])


def test_result_is_the_exact_product_rounded_once():
    """One output checked in rational arithmetic: y = s / sqrt(128) * sum_g norm_g * D_g, with
    D_g the exact integer-weighted codebook sum; our float64 epilogue rounds the group sum and
    the scale steps, so the result is within a few float64 ulps of exact before the float32
    rounding, i.e. equal to the exact value rounded to float32 or one float32 ulp away."""
    archive, matrices = _matrices("tiny", ["layer00.out_proj"])
    cq = archive.cq("layer00.out_proj")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, cq.cols)).astype(F32)
    v, scale = exact.a8_rotate(x, cq.in_pad)
    y = exact.cq_matmul(v, scale, matrices[0])
    from needlepoint.kernels.cq import unpack_indices

    idx = unpack_indices(cq)
    codebook = [Fraction(float(c)) for c in cq.codebook]
    for row in (0, 7, cq.rows - 1):
        total = Fraction(0)
        for g in range(cq.in_pad // 128):
            dot = sum(
                (codebook[int(idx[row, c])] * int(v[0, c]) for c in range(g * 128, g * 128 + 128)),
                Fraction(0),
            )
            total += Fraction(float(cq.norms[row, g])) * dot
        exact_value = total * Fraction(float(scale[0])) * Fraction(exact.INV_SQRT_GROUP)
        got = Fraction(float(y[0, row]))
        ulp = Fraction(float(np.spacing(np.abs(y[0, row]))))
        assert abs(got - exact_value) <= ulp


def test_matches_the_float_product_of_the_dequantised_matrix():
    """Same product as `fake_quant_a8(x) @ dequantize(W).T` (upstream's form) up to float32
    rounding of the dequantised weights and the float sums."""
    archive, matrices = _matrices("small", ["layer02.q_proj"])
    weights = dequantize(archive.cq("layer02.q_proj"))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, weights.shape[1])).astype(F32)
    ours = exact.a8_product(x, matrices)
    upstream_form = fake_quant_a8(x) @ weights.T
    assert np.abs(ours - upstream_form).max() <= 2e-6 * np.abs(upstream_form).max()


def test_a8_codes_match_fake_quant():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((6, 200)) * 5).astype(F32)
    codes, scale = exact.a8_codes(x)
    assert codes.dtype == np.int8
    np.testing.assert_array_equal(codes.astype(F32) * scale[:, None], fake_quant_a8(x))
    reference = exact.a8_codes(x, use_native=False)
    np.testing.assert_array_equal(codes, reference[0])
    np.testing.assert_array_equal(scale, reference[1])
    v_native, s_native = exact.a8_rotate(x, 256, use_native=True)
    v_ref, s_ref = exact.a8_rotate(x, 256, use_native=False)
    np.testing.assert_array_equal(v_native, v_ref)
    np.testing.assert_array_equal(s_native, s_ref)
    assert np.abs(v_ref).max() <= 128 * 128


@pytest.mark.parametrize("use_native", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_activations_are_refused(use_native, bad):
    x = np.ones((2, 128), F32)
    x[1, 5] = bad
    with pytest.raises(NonFiniteActivationError):
        exact.a8_rotate(x, 128, use_native)
    with pytest.raises(NonFiniteActivationError):
        exact.a8_codes(x, use_native)


def test_codebook_check_refuses_inexact_codebooks():
    exact.check_codebook(np.array([-0.13, -0.04, 0.04, 0.13], F32))
    with pytest.raises(exact.ExactEngineError):
        exact.check_codebook(np.array([1e-20, 1.0], F32))


def test_without_the_built_library_the_reference_runs(monkeypatch, tmp_path):
    """No compiler at install time = no library file: the loader says why (the references
    then run everything: test_v3_exact's native-vs-reference test runs a model so);
    NEEDLEPOINT_NATIVE=0 switches the library off without a warning."""
    monkeypatch.setattr(native, "HERE", tmp_path)
    library, reason = native.load_library()
    assert library is None and "not built" in reason
    script = (
        "import warnings, numpy as np\n"
        "warnings.simplefilter('error')\n"
        "try:\n    import needlepoint\nexcept RuntimeWarning as w:\n    print('warned:', w)\n"
    )
    import subprocess
    import sys

    env = {**__import__("os").environ, "NEEDLEPOINT_NATIVE": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "warned" not in done.stdout  # disabled on purpose: quiet
