"""The architecture registry: every built-in architecture's one GGUF tensor map read both ways,
and a new architecture added as one definition (`ARCH` below, as a `formats/arch/<name>.py`
would export it) plus a model written by the test: registered, loaded from a Hugging Face
directory and from a GGUF file the writer made from the same map, and run.

The test architecture, "toy3", is Llama with its own tensor names, its own GGUF name and a
per-layer attribute of its own config (`window_layers`: the layers that see only the last
`sliding_window` positions). Its weights are llama-tiny's, renamed, so where the window does
not bite its logits are Llama's bits."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
from gguf_family_helpers import fixture_vocab as _vocab
from hf_helpers import hf_fixture_dir
from safetensors.numpy import load_file, save_file

import needlepoint
from needlepoint.errors import UnsupportedArchitectureError
from needlepoint.formats.arch import llama, qwen2
from needlepoint.formats.arch.base import Architecture, GGUFForm, TensorMap, TensorNames
from needlepoint.formats.arch.common import config_int, gguf_decoder, per_layer
from needlepoint.formats.arch.registry import architectures, by_gguf, register, unregister
from needlepoint.formats.gguf_write import gguf_tensor_name, write_gguf

WINDOW = 8

# Hugging Face stems of the toy checkpoint <- llama's
RENAME = {
    "model.embed_tokens": "embed", "model.norm": "final_norm", "lm_head": "head",
    "model.layers.{i}.input_layernorm": "blocks.{i}.ln_attn",
    "model.layers.{i}.post_attention_layernorm": "blocks.{i}.ln_mlp",
    "model.layers.{i}.self_attn.q_proj": "blocks.{i}.attn.wq",
    "model.layers.{i}.self_attn.k_proj": "blocks.{i}.attn.wk",
    "model.layers.{i}.self_attn.v_proj": "blocks.{i}.attn.wv",
    "model.layers.{i}.self_attn.o_proj": "blocks.{i}.attn.wo",
    "model.layers.{i}.mlp.gate_proj": "blocks.{i}.mlp.w1",
    "model.layers.{i}.mlp.up_proj": "blocks.{i}.mlp.w3",
    "model.layers.{i}.mlp.down_proj": "blocks.{i}.mlp.w2",
}
TOY_TO_LLAMA = TensorMap({toy: hf for hf, toy in RENAME.items()})
NAMES = TensorNames(
    embed="embed.weight", positions=None, final_norm="final_norm.weight",
    lm_head="head.weight", norm1="blocks.{i}.ln_attn.weight", norm2="blocks.{i}.ln_mlp.weight",
    q="blocks.{i}.attn.wq.weight", k="blocks.{i}.attn.wk.weight",
    v="blocks.{i}.attn.wv.weight", qkv=None, o="blocks.{i}.attn.wo.weight",
    gate="blocks.{i}.mlp.w1.weight", up="blocks.{i}.mlp.w3.weight",
    down="blocks.{i}.mlp.w2.weight", in_out=False)
TENSORS = TensorMap({gguf: RENAME[hf] for gguf, hf in llama.TENSORS.pairs.items()})


def fields(config: dict) -> dict:
    """Llama's fields, then this architecture's own: a window on `window_layers`."""
    out = llama.fields(dict(config, model_type="llama"))
    layers = config_int(config, "num_hidden_layers")
    windowed = set(config.get("window_layers", []))
    windows = tuple(config["sliding_window"] if i in windowed else None for i in range(layers))
    return dict(out, architecture="toy3",
                layers=per_layer(windows, tuple(layer["theta"] for layer in out["layers"])))


def gguf_config(meta, common: dict) -> dict:
    return {**gguf_decoder(meta, common, "toy3"), "hidden_act": "silu",
            "rope_theta": float(meta("rope.freq_base", 10000.0)),
            "sliding_window": int(meta("attention.sliding_window", 0)),
            "window_layers": list(meta("window_layers", []))}


def write_metadata(writer, config: dict) -> None:
    qwen2.write_qwen(writer, dict(config, rope_parameters={"rope_theta": 10000.0}))
    writer.add_sliding_window(config["sliding_window"])
    writer.add_array("toy3.window_layers", config["window_layers"])


ARCH = Architecture(name="toy3", model_types=("toy3",), fields=fields, names=NAMES,
                    gguf=GGUFForm("toy3", TENSORS, gguf_config, write_metadata))


@pytest.fixture
def toy3():
    register(ARCH)
    yield ARCH
    unregister("toy3")


def _toy_dir(tmp_path):
    source = hf_fixture_dir("llama-tiny")
    out = tmp_path / "toy3"
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("reference.*", "*.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config.update(model_type="toy3", architectures=["Toy3ForCausalLM"], sliding_window=WINDOW,
                  window_layers=[1, 3])
    (out / "config.json").write_text(json.dumps(config))
    tensors = {}
    for name, value in load_file(str(source / "model.safetensors")).items():
        stem, _, suffix = name.rpartition(".")
        tensors[f"{TOY_TO_LLAMA.to_gguf(stem)}.{suffix}"] = value
    save_file(tensors, str(out / "model.safetensors"))
    return out, config, tensors


@pytest.mark.parametrize("arch", [a for a in architectures() if a.gguf is not None],
                         ids=lambda a: a.name)
def test_one_tensor_map_read_both_ways(arch) -> None:
    for gguf, hf in arch.gguf.tensors.pairs.items():
        for i in (0, 7, 12):
            assert arch.gguf.tensors.to_hf(gguf.format(i=i)) == hf.format(i=i)
            assert arch.gguf.tensors.to_gguf(hf.format(i=i)) == gguf.format(i=i)
    assert arch.gguf.tensors.to_hf("blk.3.no_such_tensor") is None


def test_each_name_and_model_type_has_one_architecture() -> None:
    names = [a.name for a in architectures()]
    types = [t for a in architectures() for t in a.model_types]
    assert len(set(names)) == len(names) and len(set(types)) == len(types)
    assert {"llama", "gpt2", "qwen2", "qwen3", "gemma3"} <= set(names)
    with pytest.raises(ValueError, match="clashes"):
        register(replace(ARCH, name="llama"))
    with pytest.raises(UnsupportedArchitectureError, match="'toy3'"):
        by_gguf("toy3", "x.gguf")


@pytest.mark.parametrize("numerics", ["float", "int8"])
def test_an_architecture_defined_in_a_test_loads_and_runs(toy3, tmp_path, numerics) -> None:
    folder, config, tensors = _toy_dir(tmp_path)
    model = needlepoint.load(folder, numerics=numerics)
    assert [layer.window for layer in model.config.layers] == [None, WINDOW, None, WINDOW]
    llama_model = needlepoint.load(hf_fixture_dir("llama-tiny"), numerics=numerics)
    ids = [int(i) for i in np.random.default_rng(3).integers(5, 1000, 20)]
    logits = model.forward(ids)
    reference = llama_model.forward(ids)
    # positions that see no more than the window: Llama's bits; later ones: the window bites
    assert np.array_equal(logits[:WINDOW], reference[:WINDOW])
    assert np.abs(logits[WINDOW + 2:] - reference[WINDOW + 2:]).max() > 1e-3

    # the writer reads the same map the other way: GGUF names of the toy's own tensors
    assert gguf_tensor_name("toy3", "blocks.2.attn.wq.weight") == "blk.2.attn_q.weight"
    path = write_gguf(tmp_path / "toy3.gguf", "toy3", config, tensors.items(),
                      _vocab(hf_fixture_dir("qwen2-tiny"), "qwen2"))
    from_gguf = needlepoint.load(path, numerics=numerics)
    # (the tokenizer is qwen2-tiny's: other special ids)
    assert replace(from_gguf.config, bos_id=None, eos_id=None) == replace(
        model.config, bos_id=None, eos_id=None)
    assert np.array_equal(from_gguf.forward(ids), logits)
