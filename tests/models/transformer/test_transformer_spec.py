"""The block spec from config.json fields (shared/fixtures/hf/README.md, "config.json fields
that matter"), and typed errors for unknown architectures, options, missing tensors and shape
mismatches in Hugging Face directories."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from hf_helpers import hf_fixture_dir

import needlepoint
from needlepoint.errors import (
    CheckpointError,
    MissingTensorError,
    NeedlepointError,
    TensorShapeError,
    UnsupportedArchitectureError,
)
from needlepoint.models.transformer.spec import spec_from_config


def config(name: str) -> dict:
    return json.loads((hf_fixture_dir(name) / "config.json").read_text())


def test_llama_spec_from_the_fixture_config() -> None:
    spec = spec_from_config(config("llama-tiny"))
    assert (spec.d_model, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            spec.d_ff, spec.vocab, spec.max_seq_len) == (128, 4, 8, 4, 16, 352, 1004, 512)
    assert (spec.norm, spec.gated, spec.activation, spec.rope, spec.learned_positions) == (
        "rms", True, "silu", True, False)
    assert (spec.qkv_fused, spec.qkv_bias, spec.out_bias, spec.mlp_bias,
            spec.tied_embeddings) == (False, False, False, False, False)
    assert spec.rope_theta == 10000.0 and spec.attn_scale == pytest.approx(0.25)
    assert (spec.group, spec.bos_id, spec.eos_id) == (2, 1, 2)


def test_gpt2_spec_from_the_fixture_config() -> None:
    spec = spec_from_config(config("gpt2-tiny"))
    assert (spec.d_model, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.d_ff) == (
        128, 4, 4, 32, 512)  # n_inner null -> 4 d
    assert (spec.norm, spec.gated, spec.activation, spec.rope, spec.learned_positions,
            spec.qkv_fused, spec.tied_embeddings) == (
        "layer", False, "gelu_tanh", False, True, True, True)
    assert spec.attn_scale == pytest.approx(1 / math.sqrt(32))
    flags = dict(config("gpt2-tiny"), scale_attn_weights=False,
                 scale_attn_by_inverse_layer_idx=True)
    spec = spec_from_config(flags)
    assert spec.attn_scale == 1.0 and spec.scale_by_layer


def test_llama_config_variants() -> None:
    base = config("llama-tiny")
    old = {k: v for k, v in base.items() if k != "rope_parameters"}
    assert spec_from_config(dict(old, rope_theta=500000.0)).rope_theta == 500000.0
    assert spec_from_config(dict(old, rope_theta=1e6, rope_scaling=None)).rope_theta == 1e6
    assert spec_from_config(old).rope_theta == 10000.0  # absent: the default
    plain = dict(base, head_dim=None, num_key_value_heads=None, attention_bias=True,
                 mlp_bias=True, tie_word_embeddings=True)
    spec = spec_from_config(plain)
    assert (spec.head_dim, spec.num_kv_heads) == (16, 8)
    assert spec.qkv_bias and spec.out_bias and spec.mlp_bias and spec.tied_embeddings


@pytest.mark.parametrize("change, error, match", [
    ({"model_type": "mamba"}, UnsupportedArchitectureError, "'mamba'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}},
     UnsupportedArchitectureError, "'llama3'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, UnsupportedArchitectureError,
     "'linear'"),
    ({"hidden_act": "gelu"}, UnsupportedArchitectureError, "hidden_act"),
    ({"num_key_value_heads": 3}, CheckpointError, "kv heads"),
    ({"hidden_size": None}, CheckpointError, "hidden_size"),
    ({"intermediate_size": "big"}, CheckpointError, "intermediate_size"),
])
def test_config_errors(change, error, match) -> None:
    with pytest.raises(error, match=match):
        spec_from_config(dict(config("llama-tiny"), **change))


def _copy(name: str, out, drop: str | None = None, **config_changes):
    from safetensors.numpy import load_file, save_file

    folder = hf_fixture_dir(name)
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("reference.*"))
    if drop:
        tensors = load_file(str(folder / "model.safetensors"))
        del tensors[drop]
        save_file(tensors, str(out / "model.safetensors"))
    if config_changes:
        (out / "config.json").write_text(json.dumps(dict(config(name), **config_changes)))
    return out


def test_missing_tensor_is_named(tmp_path) -> None:
    path = _copy("llama-tiny", tmp_path / "m", drop="model.layers.2.self_attn.v_proj.weight")
    with pytest.raises(MissingTensorError, match="'model.layers.2.self_attn.v_proj.weight'"):
        needlepoint.load(path)
    path = _copy("gpt2-tiny", tmp_path / "b", drop="transformer.h.0.attn.c_attn.bias")
    with pytest.raises(MissingTensorError, match="'transformer.h.0.attn.c_attn.bias'"):
        needlepoint.load(path)
    # tie_word_embeddings false but no lm_head.weight
    path = _copy("gpt2-tiny", tmp_path / "t", tie_word_embeddings=False)
    with pytest.raises(MissingTensorError, match="'lm_head.weight'"):
        needlepoint.load(path)


def test_shape_mismatch_is_named(tmp_path) -> None:
    path = _copy("llama-tiny", tmp_path / "s", num_key_value_heads=2)
    with pytest.raises(TensorShapeError,
                       match=r"'model.layers.0.self_attn.k_proj.weight' has shape \[64, 128\]"
                             r", the config needs \[32, 128\]"):
        needlepoint.load(path)
    path = _copy("gpt2-tiny", tmp_path / "p", n_positions=1024)
    with pytest.raises(TensorShapeError, match="'transformer.wpe.weight'"):
        needlepoint.load(path)


def test_unknown_architecture_directory(tmp_path) -> None:
    path = _copy("gpt2-tiny", tmp_path / "u", model_type="bert")
    with pytest.raises(UnsupportedArchitectureError, match="'bert'") as caught:
        needlepoint.load(path)
    assert isinstance(caught.value, NeedlepointError)
