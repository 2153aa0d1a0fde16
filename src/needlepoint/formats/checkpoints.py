"""What kind of checkpoint a path is, and opening it: a Hugging Face model directory (a folder
with `config.json`) or a GGUF file (`.gguf` suffix or the `GGUF` magic)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .hf_checkpoint import is_hf_directory, open_hf_directory

GGUF_MAGIC = b"GGUF"


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
