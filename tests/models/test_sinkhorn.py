"""The one Sinkhorn (`models.ops.sinkhorn`, issue 27 item 1): the native kernel and the numpy
reference give the same bits, and both compute the fixture README's definition (step 5:
`rounds` of subtracting the row, then the column, log-sum-exp, then exp), written out here
from the README in float64 rather than taken from the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from needlepoint.kernels import native
from needlepoint.models.ops import sinkhorn, sinkhorn_reference

F32 = np.float32


def readme_sinkhorn(logits: np.ndarray, rounds: int = 20) -> np.ndarray:
    """README step 5 in float64, literally: z -= logsumexp over rows, then over columns."""
    z = logits.astype(np.float64)
    for _ in range(rounds):
        for axis in (-1, -2):
            peak = z.max(axis=axis, keepdims=True)
            z = z - (peak + np.log(np.exp(z - peak).sum(axis=axis, keepdims=True)))
    return np.exp(z)


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_native_equals_reference_and_the_readme_definition(n):
    assert native.library() is not None, "the native library is built by pip install -e ."
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal((33, n, n)) * 3).astype(F32)
    logits[0] = 0.0  # all equal: the uniform matrix 1/n
    out = sinkhorn(logits)
    np.testing.assert_array_equal(out, sinkhorn_reference(logits))
    np.testing.assert_allclose(out, readme_sinkhorn(logits), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(out[0], np.full((n, n), F32(1.0 / n)))
    # rows are computed on their own: one matrix alone gives the same bits as in the batch
    np.testing.assert_array_equal(sinkhorn(logits[5:6]), out[5:6])


def test_a_spread_past_the_scaling_form_falls_back_to_the_log_domain():
    logits = np.zeros((2, 4, 4), F32)
    logits[1, 0, 0] = 900.0  # exp(-900) underflows float64: the scaling form cannot hold it
    out = sinkhorn(logits)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, readme_sinkhorn(logits), atol=1e-6)
    np.testing.assert_array_equal(out, sinkhorn_reference(logits))
