"""GGUF files of the Qwen2 / Qwen3 / Gemma 3 families, written as llama.cpp's converter writes
them (`gguf_family_helpers`), read back as the Hugging Face checkpoint (issue 28 item 2): the
same config fields, the same tensor names, the same tensors (no q/k un-permutation for these
families; Gemma's `1 + w` norms back to `w`), the same tokenizer ids and chat template. No
forward pass: the logits are `tests/models/transformer/test_transformer_gguf_families.py`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf_family_helpers import FAMILY_FIXTURES, gguf_tensor_name, write_family_gguf
from hf_helpers import hf_reference

from needlepoint.errors import UnsupportedArchitectureError
from needlepoint.formats.gguf_checkpoint import open_gguf
from needlepoint.formats.hf_checkpoint import open_hf_directory

FORWARD_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                  "vocab_size", "tie_word_embeddings", "rms_norm_eps", "rope_parameters",
                  "bos_token_id", "eos_token_id")
GEMMA_FIELDS = ("head_dim", "layer_types", "sliding_window", "query_pre_attn_scalar",
                "hidden_activation", "attn_logit_softcapping", "final_logit_softcapping")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf_families")
    return {name: open_gguf(write_family_gguf(name, folder / f"{name}.gguf"))
            for name in FAMILY_FIXTURES}


@pytest.mark.parametrize("name", list(FAMILY_FIXTURES))
def test_config_fields_that_change_the_forward_match_config_json(files, name) -> None:
    gguf_file, hf = files[name], open_hf_directory(hf_reference(name).folder)
    assert gguf_file.architecture == FAMILY_FIXTURES[name]
    fields = FORWARD_FIELDS + (GEMMA_FIELDS if name == "gemma3-tiny" else ("layer_types",))
    if name == "qwen3-tiny":
        fields += ("head_dim",)  # 32, not hidden / heads = 24
    assert {k: gguf_file.config.get(k) for k in fields} == {k: hf.config.get(k) for k in fields}
    if name == "qwen2-tiny":
        assert gguf_file.config["use_sliding_window"] is False


@pytest.mark.parametrize("name", list(FAMILY_FIXTURES))
def test_mapped_tensors_equal_the_safetensors_tensors(files, name) -> None:
    gguf_file, hf = files[name], open_hf_directory(hf_reference(name).folder)
    assert sorted(gguf_file.names()) == sorted(hf.names())
    shifted = 0
    for tensor in hf.names():
        assert gguf_file.source_name(tensor) == gguf_tensor_name(FAMILY_FIXTURES[name], tensor)
        assert gguf_file.shape(tensor) == hf.shape(tensor), tensor
        ours, theirs = gguf_file.tensor(tensor), hf.tensor(tensor)
        if name == "gemma3-tiny" and tensor.endswith("norm.weight"):
            # stored float32(1 + w); offered s - 1 (exact): 1 + it is transformers' 1 + w
            one = np.float32(1.0)
            np.testing.assert_array_equal(one + ours, one + theirs, tensor)
            np.testing.assert_array_equal(ours, (one + theirs) - one, tensor)
            shifted += 1
        else:  # q/k stored unpermuted for these families: bit for bit
            np.testing.assert_array_equal(ours, theirs, tensor)
    if name == "gemma3-tiny":
        assert shifted == 6 * 6 + 1  # four block norms and q/k norms per layer, the final norm


@pytest.mark.parametrize("name", list(FAMILY_FIXTURES))
def test_tokenizer_and_chat_template_from_the_gguf(files, name) -> None:
    ref = hf_reference(name)
    tokenizer = files[name].tokenizer
    for prompt in ref.prompts:
        i = prompt["index"]
        # Gemma's chat prompt (p2) is encoded without special tokens: its template emits <bos>
        specials = not (name == "gemma3-tiny" and i == 2)
        assert tokenizer.encode(prompt["text"], specials) == ref[f"p{i}_ids"].tolist(), i
    example = json.loads((ref.folder / "chat_example.json").read_text())
    kwargs = example.get("template_kwargs") or {}
    rendered = tokenizer.apply_chat_template(example["messages"], tools=example["tools"],
                                             add_generation_prompt=True, **kwargs)
    assert rendered == example["rendered"]


def test_quantised_family_gguf_keeps_its_blocks(tmp_path) -> None:
    import gguf
    from gguf import quants

    path = write_family_gguf("qwen3-tiny", tmp_path / "q8.gguf", "Q8_0")
    gguf_file, hf = open_gguf(path), open_hf_directory(hf_reference("qwen3-tiny").folder)
    name = "model.layers.1.self_attn.k_proj.weight"
    assert gguf_file.dtype(name) == "Q8_0"
    stored = quants.quantize(hf.tensor(name), gguf.GGMLQuantizationType.Q8_0)
    expected = quants.dequantize(stored, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(gguf_file.tensor(name), expected)  # rows not permuted
    weight = gguf_file.stored_weight(name)
    assert weight.wtype.name == "Q8_0" and (weight.n_out, weight.k_in) == (64, 96)
    assert weight.data.tobytes() == stored.tobytes()  # the file's own bytes, as written
    np.testing.assert_array_equal(weight.dequantize(), expected)


def test_gemma3_layer_pattern_and_rope_metadata(tmp_path) -> None:
    def pattern(writer) -> None:
        writer.add_array("gemma3.attention.sliding_window_pattern",
                         [True, False, True, False, True, False])
        writer.add_float32("gemma3.rope.freq_base_swa", 20000.0)

    config = open_gguf(write_family_gguf("gemma3-tiny", tmp_path / "p.gguf",
                                         extra=pattern)).config
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * 3
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 20000.0

    def yarn(writer) -> None:
        writer.add_rope_scaling_type(__import__("gguf").RopeScalingType.YARN)

    with pytest.raises(UnsupportedArchitectureError, match="RoPE scaling"):
        open_gguf(write_family_gguf("gemma3-tiny", tmp_path / "y.gguf", extra=yarn))
    with pytest.raises(UnsupportedArchitectureError, match="RoPE scaling"):
        open_gguf(write_family_gguf("qwen2-tiny", tmp_path / "q.gguf", extra=yarn))


@pytest.mark.parametrize("name", list(FAMILY_FIXTURES))
def test_the_gguf_chat_template_gives_the_same_syntax_and_prompt(files, name) -> None:
    """The call syntax comes from the GGUF's `tokenizer.chat_template` as from
    `tokenizer_config.json`: same syntax, the tool request is prompt 2 (one BOS for Gemma)."""
    from needlepoint.formats.chat_format import TemplateFormat

    ref = hf_reference(name)
    example = json.loads((ref.folder / "chat_example.json").read_text())
    fmt = TemplateFormat(files[name].tokenizer, template_kwargs=example["template_kwargs"])
    from needlepoint.generation.syntaxes import syntax_for

    assert syntax_for(fmt).name == ("functiongemma" if name == "gemma3-tiny" else "qwen")
    tools = [t.get("function", t) for t in example["tools"]]
    ids = fmt.conversation_ids(example["messages"][:1], tools)
    assert ids == ref["p2_ids"].tolist()


def test_a_q4_k_m_style_file_keeps_its_k_quants(tmp_path) -> None:
    """A Q4_K_M-style gemma3-tiny: `ffn_down` Q4_K / Q6_K by layer, the rest Q8_0. Every
    tensor decodes to what gguf's own decoder reads from the file, and every quantised one is
    handed to the int8 numerics as stored (its own bytes, dequantising to the same values)."""
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    path = write_family_gguf("gemma3-tiny", tmp_path / "q4km.gguf", "Q4_K_M")
    gguf_file = open_gguf(path)
    raw = {t.name: t for t in gguf_file.reader.tensors}
    seen = set()
    for name in gguf_file.names():
        kind = gguf_file.dtype(name)
        seen.add(kind)
        if kind == "F32":
            continue
        stored = raw[gguf_file.source_name(name)]
        expected = gguf_dequantize(np.asarray(stored.data).reshape(-1).view(np.uint8),
                                   gguf.GGMLQuantizationType[kind]).reshape(
            gguf_file.shape(name))
        np.testing.assert_array_equal(gguf_file.tensor(name), expected, name)
        weight = gguf_file.stored_weight(name)
        assert weight.wtype.name == kind, name
        assert weight.data.tobytes() == np.asarray(stored.data).tobytes(), name
        np.testing.assert_array_equal(weight.dequantize(), expected, name)
    assert seen == {"F32", "Q8_0", "Q4_K", "Q6_K"}
