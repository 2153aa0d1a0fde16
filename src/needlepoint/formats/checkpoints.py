"""What kind of checkpoint a path is, and opening it: a Hugging Face model directory (a folder
with `config.json`) or a GGUF file (`.gguf` suffix or the `GGUF` magic)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import CheckpointError
from .hf_checkpoint import is_hf_directory, open_hf_directory

if TYPE_CHECKING:
    from ..kernels.blockweight import BlockWeight

GGUF_MAGIC = b"GGUF"


class TensorCheckpoint(Protocol):
    """What a model loader reads from a checkpoint (`formats.hf_checkpoint.HFCheckpoint`,
    `formats.gguf_checkpoint.GGUFCheckpoint`): tensors by their Hugging Face names, and what
    a file-backed format adds, declared so the loader never asks."""

    path: Path

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 in its Hugging Face layout."""
        ...

    def source_name(self, name: str) -> str | None:
        """The name the file stores `name` under, when it differs (GGUF), else None."""
        ...

    def stored_weight(self, name: str, threads: int = 1) -> BlockWeight | None:
        """The 2-D weight as the file stores it (GGUF integer blocks, in place), or None."""
        ...

    def release_pages(self) -> None:
        """Drop the process's resident pages of a file mapping (a no-op without one)."""
        ...


def _as_path(path: object) -> Path | None:
    return Path(path) if isinstance(path, str | os.PathLike) else None


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    file = _as_path(path)
    if file is None:
        return False
    if not file.is_file():
        return False
    if file.suffix.lower() == ".gguf":
        return True
    try:
        with open(file, "rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True for a Hugging Face model directory or a GGUF file (False for anything else,
    bytes included)."""
    return _as_path(path) is not None and (is_hf_directory(path) or is_gguf_file(path))


def open_checkpoint(path: str | os.PathLike[str]) -> Any:
    """An `HFCheckpoint` or a `GGUFCheckpoint` (same interface: `config`, `names()`,
    `shape(name)`, `tensor(name)`, `tokenizer`)."""
    if is_hf_directory(path):
        return open_hf_directory(path)
    if is_gguf_file(path):
        from .gguf_checkpoint import open_gguf  # gguf (and its imports) only when needed

        return open_gguf(path)
    raise CheckpointError(f"{path}: neither a Hugging Face model directory (with config.json) "
                          f"nor a GGUF file")
