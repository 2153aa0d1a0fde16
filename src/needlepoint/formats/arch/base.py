"""What one transformer architecture is, as data: the record every `formats/arch/<name>.py`
exports (`ARCH`) and the registry (`registry.py`) collects.

An `Architecture` says, for one family of checkpoints: which `config.json` `model_type`s it
reads and how they become the block spec's fields (every field honoured or refused by name),
where each tensor lives in a Hugging Face checkpoint (`TensorNames`), and, when llama.cpp
writes it, its GGUF architecture name, how the `<arch>.*` metadata becomes `config.json` fields
and back, and the one GGUF <-> Hugging Face tensor map (`TensorMap`) the reader
(`gguf_checkpoint.py`) and the writer (`gguf_write.py`) both read. Nothing here computes: the
forward pass (`models/transformer/`) reads the spec it is given and never asks which
architecture it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

Meta = Callable[[str, Any], Any]  # GGUF metadata: (key under "{arch}.", default) -> value
REQUIRED = object()  # a Meta default: the key must be present (else a CheckpointError)
Fields = dict[str, Any]  # BlockSpec fields by name; "layers": one dict per layer (LayerSpec)


@dataclass(frozen=True)
class TensorNames:
    """Where each weight the block needs lives in a Hugging Face checkpoint (per layer with
    `{i}`), and whether linear weights are stored `[out, in]` (torch `nn.Linear`, applied as
    x W^T) or `[in, out]` (GPT-2's `Conv1D`, applied as x W). Biases sit beside their weight
    (`.weight` -> `.bias`)."""

    embed: str
    positions: str | None
    final_norm: str
    lm_head: str
    norm1: str
    norm2: str
    q: str | None  # separate projections (None when fused)
    k: str | None
    v: str | None
    qkv: str | None  # fused q | k | v (None when separate)
    o: str
    gate: str | None  # gated MLP only
    up: str
    down: str
    in_out: bool  # linear weights stored [in, out]
    prefixes: tuple[str, ...] = ("",)  # optional name prefixes, tried in order
    q_norm: str | None = None  # per-head q / k norms (spec.qk_norm)
    k_norm: str | None = None
    attn_out_norm: str | None = None  # norms of the attention / MLP outputs (spec.output_norms)
    mlp_out_norm: str | None = None

    def layer(self, template: str, index: int) -> str:
        return template.format(i=index)


def bias_name(weight: str) -> str:
    return weight[: -len(".weight")] + ".bias" if weight.endswith(".weight") else weight + ".bias"


@cache
def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.escape(template).replace(r"\{i\}", r"(\d+)"))


@dataclass(frozen=True)
class TensorMap:
    """One table of GGUF tensor stems to Hugging Face ones (`{i}`: the layer; no `.weight` /
    `.bias`), read both ways: GGUF -> HF when a file is opened, HF -> GGUF when one is
    written (and to name the GGUF tensor behind an HF name in errors)."""

    pairs: Mapping[str, str]

    def to_hf(self, stem: str) -> str | None:
        return _translate(stem, self.pairs.items())

    def to_gguf(self, stem: str) -> str | None:
        return _translate(stem, ((hf, gguf) for gguf, hf in self.pairs.items()))


def _translate(stem: str, pairs: Any) -> str | None:
    for source, target in pairs:
        match = _pattern(source).fullmatch(stem)
        if match is not None:
            return target.format(i=match.group(1)) if match.groups() else target
    return None


# each TensorNames field's llama.cpp tensor (gguf.constants.TENSOR_NAMES)
ROLES = {
    "embed": "token_embd", "positions": "position_embd", "final_norm": "output_norm",
    "lm_head": "output", "norm1": "blk.{i}.attn_norm", "norm2": "blk.{i}.ffn_norm",
    "q": "blk.{i}.attn_q", "k": "blk.{i}.attn_k", "v": "blk.{i}.attn_v",
    "qkv": "blk.{i}.attn_qkv", "o": "blk.{i}.attn_output", "gate": "blk.{i}.ffn_gate",
    "up": "blk.{i}.ffn_up", "down": "blk.{i}.ffn_down", "q_norm": "blk.{i}.attn_q_norm",
    "k_norm": "blk.{i}.attn_k_norm", "attn_out_norm": "blk.{i}.post_attention_norm",
    "mlp_out_norm": "blk.{i}.post_ffw_norm",
}


def names_from_map(tensors: TensorMap, in_out: bool, prefixes: tuple[str, ...] = ("",)
                   ) -> TensorNames:
    """The Hugging Face names of an architecture read off its one tensor map (each role's
    llama.cpp tensor, `ROLES`; None where the map has none), relative to the first of
    `prefixes` (the others are alternatives a checkpoint may use)."""
    def name(role: str) -> str | None:
        stem = tensors.pairs.get(ROLES[role])
        return None if stem is None else stem.removeprefix(prefixes[0]) + ".weight"

    return TensorNames(**{role: name(role) for role in ROLES}, in_out=in_out,
                       prefixes=prefixes)


@dataclass(frozen=True)
class GGUFForm:
    """How llama.cpp stores an architecture: its `general.architecture`, the tensor map, the
    converter's changes to tensors (q/k rows permuted into interleaved RoPE pairs: Llama only;
    a constant added to every norm weight: Gemma 3's 1; GPT-2's Conv1D weights stored
    `[out, in]`), the `<arch>.*` metadata as `config.json` fields (`config`), and for the
    writer the reverse (`metadata(writer, config)`; None: not writable here)."""

    name: str
    tensors: TensorMap
    config: Callable[[Meta, dict[str, Any]], dict[str, Any]]  # (metadata, common) -> config
    metadata: Callable[[Any, Mapping[str, Any]], None] | None = None
    permuted_qk: bool = False
    norm_shift: float = 0.0
    transposed: tuple[str, ...] = ()  # GGUF stems (no `blk.{i}.`) stored transposed

    @property
    def embed(self) -> str:
        return f"{self.tensors.pairs['token_embd']}.weight"

    @property
    def lm_head(self) -> str:
        return f"{self.tensors.pairs['output']}.weight"


@dataclass(frozen=True)
class Architecture:
    """One architecture (module doc). `fields(config)` reads a Hugging Face config dict (or
    the one a GGUF file's metadata is translated to) into BlockSpec fields, refusing by name
    every field it does not honour."""

    name: str  # BlockSpec.architecture
    model_types: tuple[str, ...]  # the config.json model_type values it reads
    fields: Callable[[dict[str, Any]], Fields]
    names: TensorNames
    gguf: GGUFForm | None = None
    doc: str = field(default="", compare=False)
