"""A GGUF file (llama.cpp's format) as a checkpoint with Hugging Face names and config.

Read by `gguf_reader.GGUFFile` (the metadata decoded once, the file one read-only memory map;
the `gguf` package supplies the type tables and the K-quant decoders). The metadata is translated
to the `config.json` fields the model layer reads (`config`), and the tensors are offered under
their Hugging Face names, float32, in Hugging Face layout:

* every ggml type decodes through `gguf_quants.dequantize` (F32 stays a view of the file);
* llama.cpp's converter permutes the rows of `attn_q` / `attn_k` into interleaved-pair RoPE
  order (ggml's "normal" rope); they are permuted back to the half-split order, so one RoPE
  rule serves both formats;
* GPT-2's linear weights, stored `[out, in]` in GGUF, are transposed back to `Conv1D` `[in, out]`.

Supported architectures: `llama` (Llama, SmolLM, TinyLlama, ...) and `gpt2`; any other
`general.architecture`, RoPE scaling, or a `rope_freqs` tensor is an
`UnsupportedArchitectureError`.
"""

from __future__ import annotations

import mmap
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, MissingTensorError, UnsupportedArchitectureError
from .gguf_quants import dequantize, integer_blocks
from .gguf_reader import GGUFFile
from .hf_tokenizer import HFTokenizer

_LLAMA_LAYER = {
    "attn_norm": "model.layers.{i}.input_layernorm",
    "attn_q": "model.layers.{i}.self_attn.q_proj",
    "attn_k": "model.layers.{i}.self_attn.k_proj",
    "attn_v": "model.layers.{i}.self_attn.v_proj",
    "attn_output": "model.layers.{i}.self_attn.o_proj",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "ffn_up": "model.layers.{i}.mlp.up_proj",
    "ffn_down": "model.layers.{i}.mlp.down_proj",
}
_LLAMA_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_GPT2_LAYER = {
    "attn_norm": "transformer.h.{i}.ln_1",
    "attn_qkv": "transformer.h.{i}.attn.c_attn",
    "attn_output": "transformer.h.{i}.attn.c_proj",
    "ffn_norm": "transformer.h.{i}.ln_2",
    "ffn_up": "transformer.h.{i}.mlp.c_fc",
    "ffn_down": "transformer.h.{i}.mlp.c_proj",
}
_GPT2_GLOBAL = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe",
                "output_norm": "transformer.ln_f", "output": "lm_head"}
_TABLES = {"llama": (_LLAMA_GLOBAL, _LLAMA_LAYER), "gpt2": (_GPT2_GLOBAL, _GPT2_LAYER)}
_GPT2_CONV1D = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")
_NAME = re.compile(r"(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|bias)")


def _gguf():
    try:
        import gguf
    except ImportError as error:  # pragma: no cover - the `hf` extra is not installed
        raise CheckpointError("reading GGUF needs the `gguf` package: "
                              "pip install 'needlepoint[hf]'") from error
    return gguf


def field_value(field: Any) -> Any:
    """A `gguf.GGUFReader` metadata field's value (str, int, float, bool, or a list of them),
    as `GGUFFile.values` holds it."""
    gguf = _gguf()
    kinds = list(field.types)
    strings = gguf.GGUFValueType.STRING
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        if len(kinds) > 1 and kinds[-1] == strings:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        if not field.data:
            return []
        return np.concatenate([field.parts[i] for i in field.data]).tolist()
    if kinds[0] == strings:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    value = field.parts[field.data[0]][0].item()
    return bool(value) if kinds[0] == gguf.GGUFValueType.BOOL else value


class GGUFCheckpoint:
    """Config, tensors (HF names) and tokenizer of one GGUF file."""

    format = "gguf"

    def __init__(self, path: Path, reader: Any) -> None:
        self.path = path
        self.reader = reader
        self.metadata = reader.values
        self.architecture = self.value("general.architecture")
        if self.architecture not in _TABLES:
            raise UnsupportedArchitectureError(
                f"{path.name}: GGUF architecture {self.architecture!r} is not supported "
                f"(supported: {', '.join(_TABLES)})")
        self._tensors: dict[str, tuple[Any, str | None]] = {}
        for tensor in reader.tensors:
            mapped = self._hf_name(tensor.name)
            if mapped is not None:
                self._tensors[mapped[0]] = (tensor, mapped[1])
        self.config = self._config()

    # ------------------------------------------------------------------ metadata
    def value(self, key: str, default: Any = None) -> Any:
        value = self.metadata.get(key)
        return default if value is None else value

    def _arch(self, key: str, default: Any = None) -> Any:
        return self.value(f"{self.architecture}.{key}", default)

    def _required(self, key: str) -> Any:
        value = self._arch(key)
        if value is None:
            raise CheckpointError(f"{self.path.name}: missing GGUF metadata "
                                  f"{self.architecture}.{key}")
        return value

    def _config(self) -> dict[str, Any]:
        arch = self.architecture
        embed = "model.embed_tokens.weight" if arch == "llama" else "transformer.wte.weight"
        if embed not in self._tensors:
            raise MissingTensorError(f"{self.path.name}: missing tensor 'token_embd.weight'")
        vocab = self.shape(embed)[0]
        tied = "lm_head.weight" not in self._tensors
        d = int(self._required("embedding_length"))
        heads = int(self._required("attention.head_count"))
        common = {"bos_token_id": self.value("tokenizer.ggml.bos_token_id"),
                  "eos_token_id": self.value("tokenizer.ggml.eos_token_id"),
                  "tie_word_embeddings": tied, "vocab_size": vocab}
        if arch == "gpt2":
            return {"model_type": "gpt2", "n_embd": d, "n_head": heads,
                    "n_layer": int(self._required("block_count")),
                    "n_inner": int(self._required("feed_forward_length")),
                    "n_positions": int(self._required("context_length")),
                    "layer_norm_epsilon": float(self._arch("attention.layer_norm_epsilon", 1e-5)),
                    "activation_function": "gelu_new", **common}
        scaling = self._arch("rope.scaling.type")
        if scaling not in (None, "none") or any(n.startswith("rope_freqs") for n in
                                                 (t.name for t in self.reader.tensors)):
            raise UnsupportedArchitectureError(
                f"{self.path.name}: RoPE scaling ({scaling or 'rope_freqs tensor'}) is not "
                f"supported (only plain RoPE)")
        head_dim = int(self._arch("attention.key_length", d // heads))
        rotary = int(self._arch("rope.dimension_count", head_dim))
        if rotary != head_dim:
            raise UnsupportedArchitectureError(
                f"{self.path.name}: partial RoPE ({rotary} of {head_dim} dims) is not supported")
        return {
            "model_type": "llama", "hidden_size": d, "num_attention_heads": heads,
            "num_key_value_heads": int(self._arch("attention.head_count_kv", heads)),
            "head_dim": head_dim, "num_hidden_layers": int(self._required("block_count")),
            "intermediate_size": int(self._required("feed_forward_length")),
            "max_position_embeddings": int(self._required("context_length")),
            "rms_norm_eps": float(self._arch("attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_theta": float(self._arch("rope.freq_base", 10000.0)), "hidden_act": "silu",
            "attention_bias": "model.layers.0.self_attn.q_proj.bias" in self._tensors,
            "mlp_bias": "model.layers.0.mlp.gate_proj.bias" in self._tensors, **common,
        }

    # ------------------------------------------------------------------ tensors
    def _hf_name(self, name: str) -> tuple[str, str | None] | None:
        """(HF name, transform) of a GGUF tensor name; None for tensors the model ignores."""
        match = _NAME.fullmatch(name)
        if match is None:
            return None
        layer, base, suffix = match.groups()
        globals_, per_layer = _TABLES[self.architecture]
        target = per_layer.get(base) if layer is not None else globals_.get(base)
        if target is None:
            return None
        transform = None
        if self.architecture == "llama" and base in ("attn_q", "attn_k"):
            transform = base
        elif self.architecture == "gpt2" and base in _GPT2_CONV1D and suffix == "weight":
            transform = "transpose"
        return f"{target.format(i=layer)}.{suffix}", transform

    def source_name(self, name: str) -> str | None:
        """The GGUF tensor name that holds (or would hold) the Hugging Face tensor `name`."""
        globals_, per_layer = _TABLES[self.architecture]
        stem, _, suffix = name.rpartition(".")
        for base, target in globals_.items():
            if target == stem:
                return f"{base}.{suffix}"
        for base, target in per_layer.items():
            head, _, tail = target.partition("{i}")
            if stem.startswith(head) and stem.endswith(tail):
                index = stem[len(head) : len(stem) - len(tail)]
                if index.isdigit():
                    return f"blk.{index}.{base}.{suffix}"
        return None

    def names(self) -> list[str]:
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def _entry(self, name: str) -> tuple[Any, str | None]:
        try:
            return self._tensors[name]
        except KeyError:
            raise MissingTensorError(f"{self.path.name}: no tensor {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        tensor, transform = self._entry(name)
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        return shape[::-1] if transform == "transpose" else shape

    def dtype(self, name: str) -> str:
        return self._entry(name)[0].tensor_type.name

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 in Hugging Face layout (see the module docstring)."""
        tensor, transform = self._entry(name)
        stored = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        values = dequantize(tensor.data, tensor.tensor_type.name, stored, tensor.name)
        if transform == "transpose":
            return values.T
        if transform in ("attn_q", "attn_k"):
            key = "attention.head_count" if transform == "attn_q" else "attention.head_count_kv"
            heads = int(self._arch(key, self._arch("attention.head_count")))
            values = unpermute_rope_rows(values, heads)
        return values

    def blocks(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
        """A 2-D tensor's stored integer blocks (`gguf_quants.integer_blocks`) in the stored
        `[out, in]` orientation, blocks of 32 along `in` (q/k rows un-permuted, as `tensor`);
        None when its type is not one of the integer block types."""
        tensor, transform = self._entry(name)
        stored = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        if len(stored) != 2:
            return None
        found = integer_blocks(tensor.data, tensor.tensor_type.name, *stored)
        if found is None or transform not in ("attn_q", "attn_k"):
            return found
        key = "attention.head_count" if transform == "attn_q" else "attention.head_count_kv"
        heads = int(self._arch(key, self._arch("attention.head_count")))
        return tuple(None if a is None else unpermute_rope_rows(a, heads) for a in found)

    def release_pages(self) -> None:
        """Drop this process's resident pages of the file mapping (they are read again from
        the page cache if touched later): a loader that has copied what it needs (the int8
        weights) keeps the file out of its resident set."""
        handle = getattr(self.reader.data, "_mmap", None)
        if handle is not None and hasattr(mmap, "MADV_DONTNEED"):
            try:
                handle.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # pragma: no cover - platform without madvise
                pass

    @cached_property
    def tokenizer(self) -> HFTokenizer:
        from .gguf_tokenizer import tokenizer_from_gguf

        return tokenizer_from_gguf(self)

    def __repr__(self) -> str:
        return (f"GGUFCheckpoint({self.path.name}, architecture={self.architecture!r}, "
                f"{len(self._tensors)} tensors)")


def unpermute_rope_rows(values: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: within each head, GGUF row 2j+s is HF row
    s*hd/2 + j (rows [heads*hd, ...], or a bias [heads*hd])."""
    rows = values.shape[0]
    head_dim = rows // heads
    if heads * head_dim != rows or head_dim % 2:
        raise CheckpointError(f"cannot split {rows} q/k rows into {heads} RoPE heads")
    rest = values.shape[1:]
    split = values.reshape(heads, head_dim // 2, 2, *rest)
    return np.ascontiguousarray(split.swapaxes(1, 2)).reshape(rows, *rest)


def open_gguf(path: str | os.PathLike[str]) -> GGUFCheckpoint:
    """Open and validate a GGUF file (memory-mapped, read-only)."""
    file = Path(path)
    _gguf()
    try:
        reader = GGUFFile(file)
    except (ValueError, OSError, IndexError, KeyError) as error:
        raise CheckpointError(f"{file}: not a valid GGUF file: {error}") from None
    return GGUFCheckpoint(file, reader)
