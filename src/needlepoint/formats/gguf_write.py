"""GGUF files of the Qwen2 / Qwen3 / Gemma 3 families written with `gguf.GGUFWriter` the way
llama.cpp's `convert_hf_to_gguf.py` writes them (issue 28 items 2 and 5): the tests' copies
of the fixtures and the benchmark's files in the geometry of real models both come from here
(`needlepoint.write_gguf`, docs/api.md "Public names for clients").

* architecture names `qwen2`, `qwen3`, `gemma3` and `gguf.constants`' tensor names
  (`blk.{i}.attn_q`, `attn_q_norm`, `post_attention_norm`, `post_ffw_norm`, ...);
* no q/k row permutation (only `LlamaModel` permutes; `Qwen2Model`, `Qwen3Model`,
  `Gemma3Model` do not);
* Gemma 3: every `*norm.weight` stored plus 1 (`Gemma3Model.norm_shift`), the metadata
  `Gemma3Model.set_gguf_parameters` writes (the full layers' RoPE base, `key_length`,
  `sliding_window`; neither the layer pattern nor the sliding base nor `query_pre_attn_scalar`);
* the tokenizer as `tokenizer.ggml.*` (`GgufVocab`): Qwen's byte-level BPE (`gpt2`,
  pre-tokenizer `qwen2`, its merges) or Gemma's SentencePiece-style vocabulary (`llama`,
  scores, no space prefix), and the chat template.

2-D weights are written in the quant type a `qtype` names or chooses per tensor (Q8_0, Q4_0,
... as `gguf.quants` quantises them; Q4_K / Q6_K by `gguf_kquants`' encoders, which `gguf`
lacks); 1-D tensors F32.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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

# a quant type for every 2-D weight, or a choice per weight: (HF name, [rows, cols]) -> type
QType = str | Callable[[str, tuple[int, int]], str]


@dataclass(frozen=True)
class GgufVocab:
    """A tokenizer as GGUF's `tokenizer.ggml.*` keys hold it. `model`: "gpt2" (byte-level
    BPE: `merges`, `pre`) or "llama" (SentencePiece-style: `scores`); `types`: GGUF token
    types (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte); `special`: ids of
    "bos" / "eos" / "unk" / "pad" (those given)."""

    model: str
    tokens: list[str]
    types: list[int]
    special: Mapping[str, int] = field(default_factory=dict)
    merges: list[str] = field(default_factory=list)
    scores: list[float] | None = None
    pre: str | None = None
    add_bos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None


def gguf_tensor_name(arch: str, name: str) -> str:
    """llama.cpp's GGUF name of a Hugging Face tensor of these families."""
    if name in _TOP:
        return _TOP[name]
    rest = name.removeprefix("model.layers.")
    index, _, stem = rest.partition(".")
    stem, _, suffix = stem.rpartition(".")
    table = {**_LAYER, **(_GEMMA_NORMS if arch == "gemma3" else _QWEN_NORMS)}
    return f"blk.{index}.{table[stem]}.{suffix}"


def _metadata(writer: Any, arch: str, config: Mapping[str, Any]) -> None:
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


def _vocab(writer: Any, vocab: GgufVocab) -> None:
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.add_bos is not None:
        writer.add_add_bos_token(vocab.add_bos)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
              "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id}
    for key, token_id in vocab.special.items():
        adders[key](token_id)
    writer.add_token_types(vocab.types)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def quantise(value: np.ndarray, kind: str) -> np.ndarray:
    """A float32 matrix [rows, cols] as the GGUF payload of quant type `kind` (uint8
    [rows, bytes per row])."""
    from gguf import GGMLQuantizationType, quants

    from .gguf_kquants import quantize_q4_k, quantize_q6_k

    if kind in ("Q4_K", "Q6_K"):
        encode = quantize_q4_k if kind == "Q4_K" else quantize_q6_k
        return encode(value.reshape(-1)).reshape(value.shape[0], -1)
    return quants.quantize(value, GGMLQuantizationType[kind])


def write_gguf(out: str | os.PathLike[str], arch: str, config: Mapping[str, Any],
               tensors: Iterable[tuple[str, np.ndarray]], vocab: GgufVocab,
               qtype: QType = "F32", *, extra: Callable[[Any], None] | None = None) -> Path:
    """Write a `qwen2` / `qwen3` / `gemma3` GGUF as llama.cpp's converter does (module doc).

    `config`: the Hugging Face `config.json` fields (`rope_parameters` as transformers 5
    writes them); `tensors`: (Hugging Face name, float32 array) pairs, consumed one at a time
    (each is quantised as it comes, so a large model's float weights need not all exist at
    once); `qtype`: the type of every 2-D weight, or a function choosing it per weight;
    `extra(writer)` adds metadata. Needs the `gguf` package."""
    import gguf

    writer = gguf.GGUFWriter(str(out), arch)
    _metadata(writer, arch, config)
    _vocab(writer, vocab)
    if extra is not None:
        extra(writer)
    for name, value in tensors:
        value = np.asarray(value, np.float32)
        if arch == "gemma3" and name.endswith("norm.weight"):
            value = value + np.float32(1.0)
        target = gguf_tensor_name(arch, name)
        kind = qtype if isinstance(qtype, str) else (
            qtype(name, value.shape) if value.ndim == 2 else "F32")
        if value.ndim == 2 and kind != "F32":
            writer.add_tensor(target, quantise(value, kind),
                              raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            writer.add_tensor(target, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)
