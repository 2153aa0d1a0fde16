"""Hugging Face model directories: config, single and sharded safetensors, typed errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hf_helpers import hf_fixture_dir, hf_reference

from needlepoint.errors import CheckpointError, MissingTensorError
from needlepoint.formats.checkpoints import is_checkpoint, is_gguf_file, open_checkpoint
from needlepoint.formats.hf_checkpoint import HFCheckpoint, open_hf_directory


def test_fixture_directories_open_with_their_config_and_tensors() -> None:
    llama = open_hf_directory(hf_fixture_dir("llama-tiny"))
    assert llama.config["model_type"] == "llama"
    assert llama.config["rope_parameters"]["rope_theta"] == 10000.0
    assert len(llama.names()) == 39 and "lm_head.weight" in llama
    assert llama.shape("model.layers.0.mlp.gate_proj.weight") == (352, 128)
    gpt2 = open_hf_directory(hf_fixture_dir("gpt2-tiny"))
    assert len(gpt2.names()) == 52 and "lm_head.weight" not in gpt2
    assert gpt2.shape("transformer.h.0.attn.c_attn.weight") == (128, 384)  # Conv1D [in, out]
    assert gpt2.generation_config["eos_token_id"] == 0


def test_checkpoint_detection(tmp_path) -> None:
    folder = hf_fixture_dir("llama-tiny")
    assert is_checkpoint(folder) and not is_gguf_file(folder)
    assert isinstance(open_checkpoint(folder), HFCheckpoint)
    plain = tmp_path / "weights.bin"
    plain.write_bytes(b"GGUF" + bytes(20))
    assert is_gguf_file(plain)  # by magic, whatever the suffix
    assert not is_checkpoint(tmp_path) and not is_checkpoint(b"bytes")
    with pytest.raises(CheckpointError, match="neither"):
        open_checkpoint(tmp_path)


def _shard(folder, out, split_at: int = 20) -> dict[str, str]:
    """Write the fixture's tensors as two shards plus model.safetensors.index.json."""
    from safetensors.numpy import load_file, save_file

    out.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        shutil.copy(folder / name, out / name)
    tensors = load_file(str(folder / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for k, part in enumerate((names[:split_at], names[split_at:])):
        filename = f"model-0000{k + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(out / filename), metadata={"format": "pt"})
        weight_map.update({n: filename for n in part})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return weight_map


def test_sharded_checkpoint_gives_the_same_model(tmp_path) -> None:
    import needlepoint

    weight_map = _shard(hf_fixture_dir("llama-tiny"), tmp_path / "sharded")
    checkpoint = open_hf_directory(tmp_path / "sharded")
    assert sorted(checkpoint.names()) == sorted(weight_map)
    ref = hf_reference("llama-tiny")
    logits = needlepoint.load(tmp_path / "sharded", numerics="float").forward(ref["p1_ids"])
    assert np.abs(logits - ref["p1_logits"]).max() <= 1e-4


def test_sharded_index_errors_name_the_shard_or_tensor(tmp_path) -> None:
    folder = tmp_path / "sharded"
    weight_map = _shard(hf_fixture_dir("llama-tiny"), folder)
    index = folder / "model.safetensors.index.json"
    moved = dict(weight_map)
    name = "model.norm.weight"
    moved[name] = next(f for f in set(weight_map.values()) if f != weight_map[name])
    index.write_text(json.dumps({"weight_map": moved}))
    with pytest.raises(MissingTensorError, match="'model.norm.weight'"):
        open_hf_directory(folder)
    index.write_text(json.dumps({"weight_map": dict(weight_map, extra="model-9.safetensors")}))
    with pytest.raises(CheckpointError, match="model-9.safetensors"):
        open_hf_directory(folder)


def test_directory_errors(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="no config.json"):
        open_hf_directory(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        open_hf_directory(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        open_hf_directory(tmp_path)
