"""How the int8 numerics consume K-quant weights (issue 28 item 2; docs/hf.md, "Numerics
(int8)"): Q4_K and Q5_K (one scale and one offset per 32 values, like Q4_1 / Q5_1) enter the
product as stored, so it equals the dequantised weight times the int8 activation to float64
rounding; Q2_K, Q3_K and Q6_K (a scale per 16 values) are dequantised and quantised once at
load to symmetric int8 blocks of 32, the path of every float weight. Either way a row's output
is the same bits alone, in a batch, and at 1 or 2 threads."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from needlepoint.formats.gguf_kquants import SIZES
from needlepoint.formats.gguf_quants import integer_blocks
from needlepoint.kernels import i8
from needlepoint.models.transformer.linear import int8_from_blocks, make_int8_linear

ROWS, COLS = 24, 512
HALVES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def k_weight(name: str, seed: int) -> np.ndarray:
    """A [ROWS, COLS] weight of random super-blocks with finite float16 d / dmin."""
    rng = np.random.default_rng(seed)
    n = ROWS * COLS // 256
    raw = rng.integers(0, 256, (n, SIZES[name]), dtype=np.uint8)
    for at in HALVES[name]:
        raw[:, at : at + 2] = (rng.standard_normal(n) * 1e-3).astype(np.float16).view(
            np.uint8).reshape(n, 2)
    return raw.reshape(-1)


def _activation(rows: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((rows, COLS)).astype(np.float32)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K"])
def test_q4_k_and_q5_k_run_as_stored(name) -> None:
    raw = k_weight(name, 3)
    weight = gguf_dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(ROWS, COLS)
    linear = int8_from_blocks(integer_blocks(raw, name, ROWS, COLS), None)
    assert linear is not None
    assert linear.parts[0].bits == (4 if name == "Q4_K" else 8)
    x = _activation(5)
    codes, scale, _ = i8.quantize(x, COLS)
    seen = (codes.reshape(5, -1, 32) * scale[:, :, None].astype(np.float64)).reshape(5, COLS)
    expect = seen @ weight.T.astype(np.float64)
    assert np.abs(linear(x) - expect).max() <= 1e-6 * np.abs(expect).max()


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q6_K"])
def test_16_wide_k_quants_are_quantised_once_at_load(name) -> None:
    raw = k_weight(name, 4)
    assert integer_blocks(raw, name, ROWS, COLS) is None
    weight = gguf_dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(ROWS, COLS)
    linear = make_int8_linear(weight, None, in_out=False)
    codes, scale = i8.quantize_weight(weight)
    x = _activation(3)
    xc, xs, _ = i8.quantize(x, COLS)
    seen = (xc.reshape(3, -1, 32) * xs[:, :, None].astype(np.float64)).reshape(3, COLS)
    stored = (codes.reshape(ROWS, -1, 32) * scale[:, :, None].astype(np.float64)).reshape(
        ROWS, COLS)
    expect = seen @ stored.T
    assert np.abs(linear(x) - expect).max() <= 1e-6 * np.abs(expect).max()
    # 8-bit codes per 32 values hold the K-quant's 16-wide values within half a step
    step = np.abs(weight.reshape(ROWS, -1, 32)).max(axis=-1, keepdims=True) / 127
    error = np.abs(stored.reshape(ROWS, -1, 32) - weight.reshape(ROWS, -1, 32))
    assert np.all(error <= step * (0.5 + 1e-5) + 1e-12)


@pytest.mark.parametrize("name", list(SIZES))
def test_k_quant_rows_are_batch_and_thread_invariant(name) -> None:
    raw = k_weight(name, 5)
    blocks = integer_blocks(raw, name, ROWS, COLS)
    weight = gguf_dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(ROWS, COLS)
    one = int8_from_blocks(blocks, None) if blocks is not None else \
        make_int8_linear(weight, None, in_out=False)
    two = int8_from_blocks(blocks, None, threads=2) if blocks is not None else \
        make_int8_linear(weight, None, in_out=False, threads=2)
    x = _activation(7)
    batch = one(x)
    for row in range(7):
        np.testing.assert_array_equal(one(x[row : row + 1])[0], batch[row])
    np.testing.assert_array_equal(two(x), batch)
