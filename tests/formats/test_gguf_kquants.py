"""K-quants through the weight-type table: the decoders of Q2_K..Q6_K equal the `gguf`
package's own `gguf.quants.dequantize` bit for bit on random super-blocks; hand-made blocks
decode as ggml's layout says; the test GGUFs' encoders write blocks gguf reads back."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from needlepoint.errors import UnsupportedTensorTypeError
from needlepoint.formats.gguf_quants import dequantize
from needlepoint.kernels.wtypes import TYPES

SIZES = {name: TYPES[name].block_bytes for name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")}

# where the float16 d (and dmin) sit in each super-block (ggml-common.h)
HALVES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_super_blocks(name: str, n: int, seed: int) -> np.ndarray:
    """n random super-blocks: random bytes, with finite float16 d / dmin of realistic size."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, SIZES[name]), dtype=np.uint8)
    for at in HALVES[name]:
        half = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 1, n)).astype(np.float16)
        raw[:, at : at + 2] = half.view(np.uint8).reshape(n, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("name", list(SIZES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k_quants_equal_gguf_bit_for_bit(name, seed) -> None:
    raw = random_super_blocks(name, 64, seed)
    expected = gguf_dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(-1)
    ours = dequantize(raw, name, (8, 64 * 256 // 8), "blk.0.ffn_up.weight").reshape(-1)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours.view(np.uint32), expected.view(np.uint32))


def test_extreme_k_quant_blocks_equal_gguf() -> None:
    """Every bit clear / every bit set (the largest codes, scales and minima)."""
    for name, size in SIZES.items():
        for fill in (0x00, 0xFF):
            raw = np.full(4 * size, fill, np.uint8).reshape(4, size)
            for at in HALVES[name]:
                raw[:, at : at + 2] = np.float16(0.5).reshape(1).view(np.uint8)
            raw = raw.reshape(-1)
            expected = gguf_dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(-1)
            np.testing.assert_array_equal(dequantize(raw, name, (4 * 256,), "t"), expected)


def _f16(value: float) -> np.ndarray:
    return np.array([value], np.float16).view(np.uint8)


def test_q4_k_block_from_the_layout() -> None:
    """Sub-block 0: sc 3, m 2; sub-block 5 (j >= 4 packing): sc 1 + 16 * 2, m 4 + 16 * 1."""
    scales = np.zeros(12, np.uint8)
    scales[0], scales[4] = 3, 2                     # j = 0: sc, m in the low 6 bits
    scales[9] = 1 | (4 << 4)                        # j = 5: low 4 bits of sc / m
    scales[1] |= 2 << 6                             # j = 5: high 2 bits of sc (from q[j-4])
    scales[5] |= 1 << 6                             # j = 5: high 2 bits of m (from q[j])
    qs = np.zeros(128, np.uint8)
    qs[:32] = np.arange(32) % 16                    # values 0..31 (low nibbles of qs[0:32])
    qs[64:96] = (np.arange(32) % 16).astype(np.uint8) << 4  # values 160..191 (high nibbles)
    block = np.concatenate([_f16(0.5), _f16(0.25), scales, qs])
    values = dequantize(block, "Q4_K", (256,), "t")
    np.testing.assert_array_equal(values[:32], 0.5 * 3 * (np.arange(32) % 16) - 0.25 * 2)
    sc5, m5 = 1 + 16 * 2, 4 + 16 * 1
    np.testing.assert_array_equal(values[160:192], 0.5 * sc5 * (np.arange(32) % 16) - 0.25 * m5)


def test_q6_k_block_from_the_layout() -> None:
    """Value 32 + l (k = 1, first half) is the low nibble of ql[32 + l] with bits 2..3 of qh[l]
    on top, minus 32, times d * scales[2 + l // 16]."""
    ql = np.zeros(128, np.uint8)
    ql[32:64] = np.arange(32) % 16
    qh = np.zeros(64, np.uint8)
    qh[:32] = 3 << 2                                # high bits 3 for k = 1
    sc = np.zeros(16, np.int8)
    sc[2], sc[3] = -2, 5
    block = np.concatenate([ql, qh, sc.view(np.uint8), _f16(0.25)])
    values = dequantize(block, "Q6_K", (256,), "t")
    codes = (np.arange(32) % 16 | 48) - 32
    np.testing.assert_array_equal(values[32:48], 0.25 * -2 * codes[:16])
    np.testing.assert_array_equal(values[48:64], 0.25 * 5 * codes[16:])
    assert not values[:32].any()  # scales[0] = scales[1] = 0


def test_truncated_k_quant_payload_names_the_tensor() -> None:
    raw = random_super_blocks("Q4_K", 2, 0)[:-5]
    with pytest.raises(UnsupportedTensorTypeError, match="'blk.3.attn_v.weight' \\(Q4_K\\)"):
        dequantize(raw, "Q4_K", (512,), "blk.3.attn_v.weight")


@pytest.mark.parametrize(("name", "width", "levels"), [("Q4_K", 32, 15), ("Q6_K", 16, 62)])
def test_encoders_write_blocks_gguf_decodes_to_the_weights(name, width, levels) -> None:
    """`quantize_q4_k` / `quantize_q6_k` (for test and benchmark GGUFs) write ggml's layout:
    gguf's own decoder reads every value back within about one step of its sub-block."""
    from needlepoint.formats.gguf_kquants import quantize_q4_k, quantize_q6_k

    weights = (np.random.default_rng(4).standard_normal(16 * 256) * 0.05).astype(np.float32)
    weights[:256] = 0.0  # an all-zero super-block stays zero
    encode = quantize_q4_k if name == "Q4_K" else quantize_q6_k
    raw = encode(weights)
    assert raw.shape == (16, SIZES[name])
    back = gguf_dequantize(raw.reshape(-1), gguf.GGMLQuantizationType[name]).reshape(-1)
    np.testing.assert_array_equal(dequantize(raw.reshape(-1), name, (16 * 256,), "t"), back)
    assert not back[:256].any()
    blocks = weights.reshape(-1, width)
    spread = blocks.max(axis=1) - np.minimum(blocks.min(axis=1), 0) if name == "Q4_K" else \
        2 * np.abs(blocks).max(axis=1)
    step = spread / levels
    error = np.abs(back.reshape(-1, width) - blocks).max(axis=1)
    assert np.all(error <= step * 1.1 + 1e-6)
