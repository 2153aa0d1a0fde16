"""GGUF copies of the Qwen2 / Qwen3 / Gemma 3 fixtures, written with `gguf.GGUFWriter` the way
llama.cpp's `convert_hf_to_gguf.py` writes these families (issue 28 item 2):

* architecture names `qwen2`, `qwen3`, `gemma3` and `gguf.constants`' tensor names
  (`blk.{i}.attn_q`, `attn_q_norm`, `post_attention_norm`, `post_ffw_norm`, ...);
* no q/k row permutation (only `LlamaModel` permutes; `Qwen2Model`, `Qwen3Model`,
  `Gemma3Model` do not);
* Gemma 3: every `*norm.weight` stored plus 1 (`Gemma3Model.norm_shift`), the metadata
  `Gemma3Model.set_gguf_parameters` writes (the full layers' RoPE base, `key_length`,
  `sliding_window`; neither the layer pattern nor the sliding base nor `query_pre_attn_scalar`);
* the tokenizer as `tokenizer.ggml.*`: Qwen's byte-level BPE (`gpt2`, pre-tokenizer `qwen2`,
  its merges); Gemma's SentencePiece-style vocabulary (`llama`, scores, no space prefix);
  the chat template from `tokenizer_config.json`.

The file holds the fixture's own weights (F32, or 2-D weights quantised by `gguf.quants`), so a
model read from it must give the fixture's transformers references.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hf_helpers import finish_gguf, hf_fixture_dir, hf_token_table

FAMILY_FIXTURES = {"qwen2-tiny": "qwen2", "qwen3-tiny": "qwen3", "gemma3-tiny": "gemma3"}

_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_QWEN_NORMS = {"post_attention_layernorm": "ffn_norm"}
_GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def gguf_tensor_name(arch: str, name: str) -> str:
    """llama.cpp's GGUF name of a Hugging Face tensor of these families."""
    if name in _TOP:
        return _TOP[name]
    rest = name.removeprefix("model.layers.")
    index, _, stem = rest.partition(".")
    stem, _, suffix = stem.rpartition(".")
    table = {**_LAYER, **(_GEMMA_NORMS if arch == "gemma3" else _QWEN_NORMS)}
    return f"blk.{index}.{table[stem]}.{suffix}"


def _metadata(writer, arch: str, config: dict) -> None:
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config["rope_parameters"]
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if arch == "gemma3":
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        writer.add_sliding_window(config["sliding_window"])
    else:
        writer.add_rope_freq_base(rope["rope_theta"])


def _tokenizer(writer, folder: Path, arch: str) -> None:
    spec, config, added, tokens, types = hf_token_table(folder)
    writer.add_token_list(tokens)
    ids = {t["content"]: i for i, t in added.items()}
    if arch == "gemma3":  # llama.cpp's _set_vocab_sentencepiece + add_space_prefix(False)
        types[ids["<unk>"]] = 2
        writer.add_tokenizer_model("llama")
        writer.add_token_scores([-float(i) for i in range(len(tokens))])
        writer.add_add_space_prefix(False)
        writer.add_add_bos_token(True)
        writer.add_bos_token_id(ids["<bos>"])
        writer.add_eos_token_id(ids["<eos>"])
        writer.add_unk_token_id(ids["<unk>"])
        writer.add_pad_token_id(ids["<pad>"])
    else:  # llama.cpp's _set_vocab_gpt2 (Qwen: pre-tokenizer "qwen2", no BOS)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        writer.add_token_merges(merges)
        writer.add_eos_token_id(ids[config["eos_token"]])
        writer.add_pad_token_id(ids[config["pad_token"]])
    writer.add_token_types(types)
    if config.get("chat_template"):
        writer.add_chat_template(config["chat_template"])


def q4_k_m_type(tensor_name: str, cols: int) -> str:
    """A Q4_K_M-style choice per 2-D weight: K-quants need rows of 256, so `ffn_down` (the
    only such rows in these fixtures) is Q4_K in even layers and Q6_K in odd ones (llama.cpp's
    Q4_K_M also gives some `ffn_down` more bits); every other matrix Q8_0."""
    if cols % 256 or "mlp.down_proj" not in tensor_name:
        return "Q8_0"
    layer = int(tensor_name.split(".")[2])
    return "Q4_K" if layer % 2 == 0 else "Q6_K"


def _quantised(value: np.ndarray, kind: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    from needlepoint.formats.gguf_kquants import quantize_q4_k, quantize_q6_k

    if kind in ("Q4_K", "Q6_K"):
        encode = quantize_q4_k if kind == "Q4_K" else quantize_q6_k
        return encode(value.reshape(-1)).reshape(value.shape[0], -1)
    return quants.quantize(value, GGMLQuantizationType[kind])


def write_family_gguf(name: str, out: Path, qtype: str = "F32", *, extra=None) -> Path:
    """The fixture `name` (qwen2-tiny, qwen3-tiny, gemma3-tiny) as llama.cpp's converter writes
    it (module doc); 2-D weights in `qtype` (F32, F16, Q8_0, Q4_0, ... as `gguf.quants`
    quantises them; "Q4_K_M": `q4_k_m_type`), 1-D tensors F32. `extra(writer)` adds metadata
    (error tests)."""
    import gguf
    from safetensors.numpy import load_file

    folder = hf_fixture_dir(name)
    arch = FAMILY_FIXTURES[name]
    config = json.loads((folder / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), arch)
    _metadata(writer, arch, config)
    _tokenizer(writer, folder, arch)
    if extra is not None:
        extra(writer)
    for tensor_name, value in load_file(str(folder / "model.safetensors")).items():
        value = np.asarray(value, np.float32)
        if arch == "gemma3" and tensor_name.endswith("norm.weight"):
            value = value + np.float32(1.0)
        target = gguf_tensor_name(arch, tensor_name)
        if value.ndim == 2 and qtype != "F32":
            kind = q4_k_m_type(tensor_name, value.shape[1]) if qtype == "Q4_K_M" else qtype
            writer.add_tensor(target, _quantised(value, kind),
                              raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            writer.add_tensor(target, value)
    finish_gguf(writer)
    return out
