"""A GGUF file (llama.cpp's format) as a checkpoint with Hugging Face names and config.

Read by `gguf_reader.GGUFFile` (the metadata decoded once, the file one read-only memory map;
the `gguf` package supplies the type tables). The metadata is translated to the `config.json`
fields the model layer reads (`config`), and the tensors are offered under their Hugging Face
names, float32, in Hugging Face layout; what each architecture means is its file in `arch/`
(its `GGUFForm`: the tensor map, the converter's changes, the metadata):

* every ggml type decodes through `gguf_quants.dequantize` (F32 stays a view of the file);
* for Llama, llama.cpp's converter permutes the rows of `attn_q` / `attn_k` into
  interleaved-pair RoPE order (ggml's "normal" rope); they are permuted back to the half-split
  order, so one RoPE rule serves both formats (Qwen 2/3 and Gemma 3 are stored unpermuted);
* Gemma 3's norm weights, stored as `1 + w`, are offered as `w`;
* GPT-2's linear weights, stored `[out, in]` in GGUF, are transposed back to `Conv1D` `[in, out]`.

Supported architectures: those of `arch/registry.py` (`llama`: Llama, SmolLM, TinyLlama, ...;
`gpt2`, `qwen2`: Qwen2 / Qwen2.5 and their fine-tunes; `qwen3`, `gemma3`: its text model); any
other `general.architecture`, unsupported RoPE scaling, or a `rope_freqs` tensor is an
`UnsupportedArchitectureError`.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    CheckpointError,
    GGUFFormatError,
    MissingTensorError,
    UnsupportedArchitectureError,
)
from ..kernels.blockweight import BlockWeight
from ..kernels.wtypes import TYPES
from .arch.base import REQUIRED, GGUFForm
from .arch.registry import by_gguf
from .gguf_quants import dequantize
from .gguf_reader import GGUFFile
from .hf_extra import hf_extra
from .hf_tokenizer import HFTokenizer

_NAME = re.compile(r"(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|bias)")


def _gguf() -> Any:
    with hf_extra("reading GGUF needs the `gguf` package", CheckpointError):
        import gguf
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
        arch = by_gguf(self.architecture, path.name).gguf
        assert arch is not None  # by_gguf finds only architectures with a GGUF form
        self.arch: GGUFForm = arch
        self._tensors: dict[str, tuple[Any, str | None]] = {}
        for tensor in reader.tensors:
            mapped = self._hf_name(tensor.name)
            if mapped is not None:
                self._tensors[mapped[0]] = (tensor, mapped[1])
        self.config = self._config()

    def source_files(self) -> list[Path]:
        """The one file the tensors and the config come from."""
        return [self.path]

    # ------------------------------------------------------------------ metadata
    def value(self, key: str, default: Any = None) -> Any:
        value = self.metadata.get(key)
        return default if value is None else value

    def _arch(self, key: str, default: Any = None) -> Any:
        return self.value(f"{self.architecture}.{key}", default)

    def _meta(self, key: str, default: Any = None) -> Any:
        value = self._arch(key)
        if value is None and default is REQUIRED:
            raise CheckpointError(f"{self.path.name}: missing GGUF metadata "
                                  f"{self.architecture}.{key}")
        return default if value is None else value

    def _config(self) -> dict[str, Any]:
        embed = self.arch.embed
        if embed not in self._tensors:
            raise MissingTensorError(f"{self.path.name}: missing tensor 'token_embd.weight'")
        if any(t.name.startswith("rope_freqs") for t in self.reader.tensors):
            raise UnsupportedArchitectureError(
                f"{self.path.name}: RoPE scaling (rope_freqs tensor) is not supported "
                f"(only plain RoPE)")
        common = {"bos_token_id": self.value("tokenizer.ggml.bos_token_id"),
                  "eos_token_id": self.value("tokenizer.ggml.eos_token_id"),
                  "tie_word_embeddings": self.arch.lm_head not in self._tensors,
                  "vocab_size": self.shape(embed)[0], "_path": self.path.name,
                  "_has": self._tensors.__contains__}
        return self.arch.config(self._meta, common)

    # ------------------------------------------------------------------ tensors
    def _hf_name(self, name: str) -> tuple[str, str | None] | None:
        """(HF name, transform) of a GGUF tensor name; None for tensors the model ignores."""
        match = _NAME.fullmatch(name)
        if match is None:
            return None
        _, base, suffix = match.groups()
        arch = self.arch
        target = arch.tensors.to_hf(name.rpartition(".")[0])
        if target is None:
            return None
        transform = None
        if arch.permuted_qk and base in ("attn_q", "attn_k"):
            transform = base
        elif base in arch.transposed and suffix == "weight":
            transform = "transpose"
        elif arch.norm_shift and base.endswith("norm") and suffix == "weight":
            transform = "norm_shift"
        return f"{target}.{suffix}", transform

    def source_name(self, name: str) -> str | None:
        """The GGUF tensor name that holds (or would hold) the Hugging Face tensor `name`."""
        stem, _, suffix = name.rpartition(".")
        target = self.arch.tensors.to_gguf(stem)
        return None if target is None else f"{target}.{suffix}"

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
        if transform == "norm_shift":  # Gemma 3: llama.cpp stores 1 + w (arch/gemma3.py)
            return values - np.float32(self.arch.norm_shift)
        if transform in ("attn_q", "attn_k"):
            values = unpermute_rope_rows(values, self._rope_heads(transform))
        return values

    def stored_weight(self, name: str, threads: int = 1) -> BlockWeight | None:
        """A 2-D weight as the file stores it, `[out, in]` rows of its own ggml blocks (a
        zero-copy view of the mapped file; `kernels.blockweight`), for the int8 numerics'
        products and embedding rows; q/k rows un-permuted as `tensor` does (llama only: a
        copy of those rows). None for a float type or a type without an integer product
        (the numerics then quantise the float tensor)."""
        tensor, transform = self._entry(name)
        stored = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        wtype = TYPES.get(tensor.tensor_type.name)
        if len(stored) != 2 or wtype is None or wtype.unpack is None:
            return None
        rows, cols = stored
        weight = BlockWeight(wtype, tensor.data.reshape(rows, -1), rows, cols, threads)
        if transform in ("attn_q", "attn_k"):
            order = unpermute_rope_rows(np.arange(rows), self._rope_heads(transform))
            weight = weight.select_rows(order)
        return weight

    def _rope_heads(self, transform: str) -> int:
        key = "attention.head_count" if transform == "attn_q" else "attention.head_count_kv"
        return int(self._arch(key, self._arch("attention.head_count")))

    def release_pages(self) -> None:
        """Drop this process's resident pages of the file mapping (they are read again from
        the page cache if touched later): a loader that has copied what it needs (the int8
        weights) keeps the file out of its resident set."""
        self.reader.release_pages()

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
    except GGUFFormatError:
        raise
    except (ValueError, OSError, IndexError, KeyError) as error:
        raise CheckpointError(f"{file}: not a valid GGUF file: {error}") from None
    return GGUFCheckpoint(file, reader)
