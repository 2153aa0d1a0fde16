"""GGUF: block decoders against hand-made blocks and gguf's own decoders, metadata to config,
tensors under Hugging Face names and layout, typed errors. The GGUF files are the fixtures'
own weights and tokenizers re-packed as llama.cpp's converter writes them (`hf_helpers`)."""

from __future__ import annotations

import numpy as np
import pytest
from hf_helpers import hf_reference, write_fixture_gguf

from needlepoint.errors import (
    CheckpointError,
    UnsupportedArchitectureError,
    UnsupportedTensorTypeError,
)
from needlepoint.formats.gguf_checkpoint import open_gguf
from needlepoint.formats.gguf_quants import dequantize
from needlepoint.formats.hf_checkpoint import open_hf_directory

HALF = {0.25: 0x3400, 0.5: 0x3800, -1.0: 0xBC00}


def f16(value: float) -> bytes:
    return HALF[value].to_bytes(2, "little")


def test_q8_0_block_from_the_layout() -> None:
    q = np.arange(-128, 128, 8, dtype=np.int8)  # 32 values
    block = f16(0.5) + q.tobytes()
    out = dequantize(np.frombuffer(block, np.uint8), "Q8_0", (1, 32), "t")
    np.testing.assert_array_equal(out[0], 0.5 * q.astype(np.float32))


def test_q4_0_and_q4_1_blocks_from_the_layout() -> None:
    j = np.arange(16)
    qs = (j | ((15 - j) << 4)).astype(np.uint8)  # low nibble j, high nibble 15 - j
    low, high = j.astype(np.float32), (15 - j).astype(np.float32)
    q4_0 = dequantize(np.frombuffer(f16(0.25) + qs.tobytes(), np.uint8), "Q4_0", (32,), "t")
    np.testing.assert_array_equal(q4_0, np.concatenate([low - 8, high - 8]) * 0.25)
    q4_1 = dequantize(np.frombuffer(f16(0.5) + f16(-1.0) + qs.tobytes(), np.uint8), "Q4_1",
                      (32,), "t")
    np.testing.assert_array_equal(q4_1, np.concatenate([low, high]) * 0.5 - 1.0)


@pytest.mark.parametrize("kind", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_decoders_agree_with_gguf_bit_for_bit(kind) -> None:
    import gguf
    from gguf import quants

    values = np.random.default_rng(7).standard_normal((6, 128)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    raw = quants.quantize(values, qtype)
    np.testing.assert_array_equal(dequantize(raw, kind, values.shape, "t"),
                                  quants.dequantize(raw, qtype))


def test_other_types_go_through_gguf_and_unknown_ones_are_typed_errors() -> None:
    import gguf
    from gguf import quants

    raw = np.random.default_rng(8).integers(0, 256, (2, 210), dtype=np.uint8)  # 2 Q6_K blocks
    raw[:, 208:] = [0x00, 0x3C]  # d = 1.0 (float16) at the end of each block
    out = dequantize(raw, "Q6_K", (2, 256), "t")
    np.testing.assert_array_equal(out, quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K))
    with pytest.raises(UnsupportedTensorTypeError, match="'blk.0.attn_q.weight'.*NOPE"):
        dequantize(np.zeros(34, np.uint8), "NOPE", (32,), "blk.0.attn_q.weight")
    with pytest.raises(UnsupportedTensorTypeError, match="'w'"):
        dequantize(np.zeros(33, np.uint8), "Q8_0", (32,), "w")  # not whole blocks


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_gguf_config_and_tensors_match_the_hf_directory(tmp_path, name) -> None:
    path = write_fixture_gguf(name, tmp_path / f"{name}.gguf")
    gguf_file = open_gguf(path)
    hf = open_hf_directory(hf_reference(name).folder)
    keys = {"llama": ["hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "intermediate_size",
                      "max_position_embeddings", "vocab_size", "tie_word_embeddings"],
            "gpt2": ["n_embd", "n_layer", "n_head", "n_positions", "vocab_size",
                     "layer_norm_epsilon"]}[hf.config["model_type"]]
    assert {k: gguf_file.config[k] for k in keys} == pytest.approx({k: hf.config[k] for k in keys})
    assert sorted(gguf_file.names()) == sorted(hf.names())
    for tensor in hf.names():  # q/k un-permuted, Conv1D transposed back: identical values
        assert gguf_file.shape(tensor) == hf.shape(tensor), tensor
        np.testing.assert_array_equal(gguf_file.tensor(tensor), hf.tensor(tensor), tensor)


def test_quantised_gguf_tensors_are_within_the_block_rounding_of_the_weights(tmp_path) -> None:
    path = write_fixture_gguf("llama-tiny", tmp_path / "q8.gguf", "Q8_0")
    gguf_file = open_gguf(path)
    hf = open_hf_directory(hf_reference("llama-tiny").folder)
    assert gguf_file.dtype("model.layers.0.self_attn.q_proj.weight") == "Q8_0"
    for tensor in ("model.layers.0.self_attn.q_proj.weight",
                   "model.layers.2.self_attn.k_proj.weight",
                   "model.layers.1.mlp.down_proj.weight"):
        weight = hf.tensor(tensor)
        blocks = np.abs(weight.reshape(-1, 32)).max(axis=1, keepdims=True)
        # half a step d = max|x| / 127, plus d's own float16 rounding times |q| <= 127
        bound = blocks / 127 * (0.5 + 127 * 2.0**-11) + 1e-7
        error = np.abs(gguf_file.tensor(tensor) - weight).reshape(-1, 32)
        assert np.all(error <= bound), tensor


def test_gguf_errors(tmp_path) -> None:
    with pytest.raises(UnsupportedArchitectureError, match="'mamba'"):
        open_gguf(write_fixture_gguf("gpt2-tiny", tmp_path / "a.gguf", architecture="mamba"))
    scaled = write_fixture_gguf("llama-tiny", tmp_path / "r.gguf",
                                extra=lambda w: w.add_rope_scaling_type(
                                    __import__("gguf").RopeScalingType.LINEAR))
    with pytest.raises(UnsupportedArchitectureError, match="RoPE scaling"):
        open_gguf(scaled)
    with pytest.raises(CheckpointError, match="token_embd"):
        open_gguf(write_fixture_gguf("llama-tiny", tmp_path / "e.gguf",
                                     skip=("token_embd.weight",)))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 40)
    with pytest.raises(CheckpointError, match="bad.gguf"):
        open_gguf(bad)
