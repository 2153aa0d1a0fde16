"""Qwen2, Qwen3 and Gemma 3 on the spec path (issue 28 item 1; shared/fixtures/hf/README.md,
second part): the spec fields read from each fixture's config, every forward-changing config
field honoured or refused with an error naming it, a multimodal `gemma3` config (its
`text_config`) over a sharded, prefixed checkpoint, sliding-window layers that honour the
window with bounded cache memory, and int8 bits that survive a long rewind and a batch.
Parity with transformers and chunk / step / thread bit identity are the parametrized tests of
test_transformer_fixtures.py and test_transformer_int8.py."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from hf_helpers import SPEC_FIXTURES, hf_fixture_dir, hf_reference

import needlepoint
from needlepoint.errors import CheckpointError, UnsupportedArchitectureError
from needlepoint.models.transformer.int8_fused import kernel_computes
from needlepoint.models.transformer.kv_cache import RESERVE
from needlepoint.models.transformer.spec import spec_from_config


def windows(spec) -> tuple:
    return tuple(layer.window for layer in spec.layers)


def thetas(spec) -> tuple:
    return tuple(layer.theta for layer in spec.layers)


def config(name: str) -> dict:
    return json.loads((hf_fixture_dir(name) / "config.json").read_text())


def test_family_spec_fields_from_the_fixture_configs() -> None:
    qwen2 = spec_from_config(config("qwen2-tiny"))
    assert (qwen2.qkv_bias, qwen2.out_bias, qwen2.qk_norm, qwen2.tied_embeddings) == (
        True, False, False, False)
    assert windows(qwen2) == (None,) * 4 and qwen2.rope_theta == 1e6 and kernel_computes(qwen2)
    qwen3 = spec_from_config(config("qwen3-tiny"))
    assert (qwen3.d_model, qwen3.head_dim, qwen3.q_dim, qwen3.kv_dim) == (96, 32, 128, 64)
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.tied_embeddings \
        and not kernel_computes(qwen3)
    gemma = spec_from_config(config("gemma3-tiny"))
    assert windows(gemma) == (48,) * 5 + (None,)
    assert thetas(gemma) == (1e4,) * 5 + (1e6,)
    assert gemma.attn_scale == pytest.approx(32 ** -0.5)
    assert gemma.embed_scale == pytest.approx(math.sqrt(128))
    assert (gemma.norm_offset, gemma.qk_norm, gemma.output_norms, gemma.activation,
            gemma.tied_embeddings, gemma.gated) == (1.0, True, True, "gelu_tanh", True, True)


def _with(name: str, **changes) -> dict:
    return {**config(name), **changes}


@pytest.mark.parametrize("name, changes, error, match", [
    ("gemma3-tiny", {"use_bidirectional_attention": True}, UnsupportedArchitectureError,
     "use_bidirectional_attention"),
    ("gemma3-tiny", {"rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     UnsupportedArchitectureError, "'linear'"),
    ("gemma3-tiny", {"layer_types": ["chunked_attention"] * 6}, UnsupportedArchitectureError,
     "layer_types"),
    ("gemma3-tiny", {"layer_types": ["full_attention"] * 3}, CheckpointError, "layer_types"),
    ("gemma3-tiny", {"hidden_activation": "relu"}, UnsupportedArchitectureError,
     "hidden_activation"),
    ("gemma3-tiny", {"query_pre_attn_scalar": 0}, CheckpointError, "query_pre_attn_scalar"),
    ("qwen2-tiny", {"layer_types": ["sliding_attention"] * 4}, CheckpointError,
     "sliding_window"),
    ("qwen3-tiny", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}},
     UnsupportedArchitectureError, "'yarn'"),
    ("qwen3-tiny", {"hidden_act": "gelu"}, UnsupportedArchitectureError, "hidden_act"),
])
def test_forward_changing_fields_are_refused_by_name(name, changes, error, match) -> None:
    with pytest.raises(error, match=match):
        spec_from_config(_with(name, **changes))


def test_forward_changing_fields_are_honoured() -> None:
    # Qwen without layer_types: use_sliding_window from layer max_window_layers on
    derived = {k: v for k, v in config("qwen2-tiny").items() if k != "layer_types"}
    spec = spec_from_config(dict(derived, use_sliding_window=True, sliding_window=16,
                                 max_window_layers=2))
    assert windows(spec) == (None, None, 16, 16) and not kernel_computes(spec)
    assert windows(spec_from_config(dict(derived, sliding_window=16))) == (None,) * 4
    # Gemma 3 before transformers 5: rope_theta / rope_local_base_freq, the layer pattern
    gemma = config("gemma3-tiny")
    legacy = {k: v for k, v in gemma.items() if k not in ("rope_parameters", "layer_types")}
    legacy.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=6)
    assert spec_from_config(legacy) == spec_from_config(gemma)
    assert spec_from_config(dict(gemma, query_pre_attn_scalar=64)).attn_scale == 0.125
    with pytest.raises(CheckpointError, match="text_config"):
        spec_from_config({"model_type": "gemma3", "text_config": None})


@pytest.mark.parametrize("prefix", ["language_model.model.", "model.language_model."])
def test_multimodal_gemma3_config_over_sharded_prefixed_tensors(tmp_path, prefix) -> None:
    """A Gemma3ForConditionalGeneration directory: its `text_config`, tensors under the
    language model's prefix in two shards with an index; the text model's logits."""
    from safetensors.numpy import load_file, save_file

    folder, out = hf_fixture_dir("gemma3-tiny"), tmp_path / "gemma3-mm"
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("reference.*", "*.safetensors",
                                                                "config.json"))
    text = config("gemma3-tiny")
    (out / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {k: v for k, v in text.items() if k != "eos_token_id"},
        "eos_token_id": text["eos_token_id"], "vision_config": {"hidden_size": 16}}))
    tensors = {prefix + name.removeprefix("model."): array
               for name, array in load_file(str(folder / "model.safetensors")).items()}
    tensors["vision_tower.unused.weight"] = np.zeros(4, np.float32)  # never read
    names = sorted(tensors)
    weight_map = {}
    for k, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        filename = f"model-0000{k + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(out / filename))
        weight_map.update({n: filename for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = needlepoint.load(out, numerics="float")
    assert model.config.eos_id == text["eos_token_id"] and windows(model.config)[0] == 48
    ref = hf_reference("gemma3-tiny")
    assert np.abs(model.forward(ref["p3_ids"]) - ref["p3_logits"]).max() <= 1e-4


def test_the_sliding_window_changes_the_logits_past_it(tmp_path) -> None:
    """With every layer full, positions < 48 keep the reference logits and later ones do
    not: the parity of the fixture's p3 (304 tokens) rests on the window."""
    out = tmp_path / "gemma3-full"
    shutil.copytree(hf_fixture_dir("gemma3-tiny"), out,
                    ignore=shutil.ignore_patterns("reference.*"))
    (out / "config.json").write_text(json.dumps(_with("gemma3-tiny", layer_types=[
        "full_attention"] * 6, rope_parameters={"rope_type": "default", "rope_theta": 1e6})))
    full = needlepoint.load(out, numerics="float")
    ref = hf_reference("gemma3-tiny")
    assert len(set(thetas(full.config))) == 1
    logits = full.forward(ref["p3_ids"])
    with_window = needlepoint.load(ref.folder, numerics="float").forward(ref["p3_ids"])
    assert np.abs(with_window - ref["p3_logits"]).max() <= 1e-4
    assert np.abs(logits[48:] - ref["p3_logits"][48:]).max() > 1.0


@pytest.mark.parametrize("numerics", ["float", "int8"])
def test_sliding_layers_keep_a_bounded_cache(numerics) -> None:
    ref = hf_reference("gemma3-tiny")
    model = needlepoint.load(ref.folder, numerics=numerics)
    session = model.session(chunk=64)
    ids = np.concatenate([ref["p3_ids"], ref["p2_ids"]])[:500]  # max_seq_len is 512
    session.prefill(ids, logits=False)
    for token in ref["p1_ids"][:8]:
        session.step(int(token))
    held = [cache.length - getattr(cache, "base", 0) for cache in session.caches.values()]
    assert all(count <= 48 - 1 + RESERVE for count in held[:5]), held
    assert held[5] == 508  # the full layer keeps every position


@pytest.mark.parametrize("name", SPEC_FIXTURES)
def test_int8_bits_after_a_long_rewind_and_in_a_batch(name) -> None:
    ref = hf_reference(name)
    model = needlepoint.load(ref.folder, numerics="int8")
    ids = ref["p3_ids"].tolist()
    full = model.forward(ids)
    session = model.session(chunk=32)
    session.prefill(ids[:250], logits=False)
    session.rewind(190)  # past a sliding window's reserve: the caches are rebuilt
    assert session.position == 60
    np.testing.assert_array_equal(session.extend(ids[60:100]), full[60:100])
    session.rewind(5)  # within it: cut in place
    np.testing.assert_array_equal(session.step(ids[95]), full[95])
    prompts = [ids[:30], ids[:120], ids[:75]]
    sessions = [model.session(chunk=c) for c in (7, 64, 1)]
    out = model.run_batch([(s, p, k == 1) for k, (s, p) in
                           enumerate(zip(sessions, prompts, strict=True))])
    np.testing.assert_array_equal(out[0], full[29])
    np.testing.assert_array_equal(out[1], full[:120])
    np.testing.assert_array_equal(out[2], full[74])
