"""GGUF files written with `gguf.GGUFWriter` the way llama.cpp's `convert_hf_to_gguf.py` writes
them, for the architectures with a writer half (`arch/<name>.py`'s `GGUFForm.metadata`: Qwen2,
Qwen3, Gemma 3): the tests' copies of the fixtures and the benchmark's files in the geometry of
real models both come from here (`needlepoint.write_gguf`, docs/api.md "Public names for
clients").

* the architecture's GGUF name and its one tensor map (`blk.{i}.attn_q`, `attn_q_norm`,
  `post_attention_norm`, `post_ffw_norm`, ...), read from Hugging Face names to GGUF ones;
* its norm shift (Gemma 3: every `*norm.weight` stored plus 1, `Gemma3Model.norm_shift`) and
  the metadata its converter writes (`GGUFForm.metadata`); an architecture whose converter
  permutes q/k rows (Llama) is not written here;
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

from ..errors import UnsupportedArchitectureError
from .arch.base import GGUFForm
from .arch.registry import by_gguf

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


def _form(arch: str) -> GGUFForm:
    """The GGUF form of a registered architecture the writer can write."""
    form = by_gguf(arch, "write_gguf").gguf
    if form is None or form.metadata is None or form.permuted_qk:
        raise UnsupportedArchitectureError(f"write_gguf: GGUF architecture {arch!r} is read but "
                                           f"not written here")
    return form


def gguf_tensor_name(arch: str, name: str) -> str:
    """llama.cpp's GGUF name of a Hugging Face tensor (the architecture's one tensor map,
    read from Hugging Face to GGUF)."""
    stem, _, suffix = name.rpartition(".")
    target = _form(arch).tensors.to_gguf(stem)
    if target is None:
        raise UnsupportedArchitectureError(f"write_gguf: no GGUF tensor of {arch} holds {name!r}")
    return f"{target}.{suffix}"


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
    """Write a GGUF of a registered architecture with a writer half (`qwen2`, `qwen3`,
    `gemma3`: `GGUFForm.metadata`) as llama.cpp's converter does (module doc).

    `config`: the Hugging Face `config.json` fields (`rope_parameters` as transformers 5
    writes them); `tensors`: (Hugging Face name, float32 array) pairs, consumed one at a time
    (each is quantised as it comes, so a large model's float weights need not all exist at
    once); `qtype`: the type of every 2-D weight, or a function choosing it per weight;
    `extra(writer)` adds metadata. Needs the `gguf` package."""
    import gguf

    form = _form(arch)
    writer = gguf.GGUFWriter(str(out), arch)
    assert form.metadata is not None  # _form checked it
    form.metadata(writer, config)
    _vocab(writer, vocab)
    if extra is not None:
        extra(writer)
    for name, value in tensors:
        value = np.asarray(value, np.float32)
        if form.norm_shift and name.endswith("norm.weight"):
            value = value + np.float32(form.norm_shift)
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
