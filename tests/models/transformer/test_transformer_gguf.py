"""GGUF models reproduce transformers: the fixtures re-packed as llama.cpp writes GGUF (F32;
q/k rows permuted, Conv1D transposed, the tokenizer as tokenizer.ggml.* metadata) give the
fixtures' ids, logits and greedy tokens; broken files are typed errors naming the tensor."""

from __future__ import annotations

import json

import pytest
from hf_helpers import (
    HF_FIXTURES,
    assert_logits_match,
    greedy_tokens,
    hf_reference,
    write_fixture_gguf,
)

import needlepoint
from needlepoint.errors import MissingTensorError, TensorShapeError


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    return {name: needlepoint.load(write_fixture_gguf(name, folder / f"{name}.gguf"),
                                   numerics="float")
            for name in HF_FIXTURES}


@pytest.mark.parametrize("name", HF_FIXTURES)
def test_gguf_model_matches_transformers(gguf_models, name) -> None:
    ref, model = hf_reference(name), gguf_models[name]
    assert model.checkpoint.format == "gguf"
    for prompt in ref.prompts:
        i = prompt["index"]
        assert model.tokenizer.encode(prompt["text"]) == ref[f"p{i}_ids"].tolist(), i
    assert_logits_match(model, ref, 1e-4)
    tokens = greedy_tokens(model, ref["p2_ids"].tolist(), len(ref["p2_greedy"]))
    assert tokens == ref["p2_greedy"].tolist()


def test_gguf_chat_template_and_special_tokens(gguf_models) -> None:
    tokenizer = gguf_models["llama-tiny"].tokenizer
    folder = hf_reference("llama-tiny").folder
    example = json.loads((folder / "chat_example.json").read_text())
    rendered = tokenizer.apply_chat_template(example["messages"], tools=example["tools"],
                                             add_generation_prompt=True)
    assert rendered == example["rendered"]
    assert tokenizer.encode(rendered) == example["ids"]
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 2)
    assert tokenizer.marker_id("<tool_call>") == 1002


def test_missing_or_misshapen_gguf_tensors_name_them(tmp_path) -> None:
    path = write_fixture_gguf("llama-tiny", tmp_path / "m.gguf", skip=("blk.1.ffn_up.weight",))
    with pytest.raises(MissingTensorError,
                       match=r"'model.layers.1.mlp.up_proj.weight' \(stored as "
                             r"'blk.1.ffn_up.weight'\)"):
        needlepoint.load(path)
    path = write_fixture_gguf("llama-tiny", tmp_path / "s.gguf",
                              config_edit={"intermediate_size": 300})
    with pytest.raises(TensorShapeError, match="'blk.0.ffn_gate.weight'.*352, 128.*300, 128"):
        needlepoint.load(path)
    path = write_fixture_gguf("gpt2-tiny", tmp_path / "g.gguf", skip=("output_norm.bias",))
    with pytest.raises(MissingTensorError, match="transformer.ln_f.bias"):
        needlepoint.load(path)
