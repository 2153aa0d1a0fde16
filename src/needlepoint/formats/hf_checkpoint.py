"""A Hugging Face model directory: `config.json`, safetensors weights, the tokenizer.

`open_hf_directory(path)` validates what it can up front (the config parses, every weight file
named by a sharded checkpoint's `model.safetensors.index.json` exists and holds the tensors the
index says) and returns an `HFCheckpoint`: the raw config dict, tensors by their Hugging Face
names (float32, memory-mapped where stored as F32), and the tokenizer (built on first use).
The model layer (`models/transformer/`) turns the config into a block spec; a GGUF file
(`formats/gguf_checkpoint.py`) offers the same interface under the same names.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError, MissingTensorError
from .hf_tokenizer import HFTokenizer
from .safetensors_file import SafetensorsFile

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def is_hf_directory(path: str | os.PathLike[str]) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read: {error}") from None
    except ValueError as error:
        raise CheckpointError(f"{path}: not valid JSON: {error}") from None


class HFCheckpoint:
    """Config, tensors and tokenizer of one Hugging Face model directory."""

    format = "safetensors"

    def __init__(self, path: Path, config: dict[str, Any],
                 files: dict[str, SafetensorsFile], weight_map: dict[str, str]) -> None:
        self.path = path
        self.config = config
        self._files = files
        self._where = weight_map

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def _file(self, name: str) -> SafetensorsFile:
        try:
            return self._files[self._where[name]]
        except KeyError:
            raise MissingTensorError(f"{self.path}: no tensor {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self._file(name).shape(name)

    def source_name(self, name: str) -> str | None:
        """The file's own name for tensor `name`: None, safetensors store Hugging Face names."""
        return None

    def stored_weight(self, name: str, threads: int = 1) -> None:
        """None: a safetensors weight is a float tensor, quantised by the numerics at load."""
        return None

    def release_pages(self) -> None:
        """Nothing to drop: each tensor is read into its own array (`tensor`)."""

    def dtype(self, name: str) -> str:
        return self._file(name).dtype(name)

    def source_files(self) -> list[Path]:
        """The files the tensors and their geometry come from: config, then weight files."""
        return [self.path / CONFIG] + [self._files[name].path for name in sorted(self._files)]

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` as float32, in its stored (Hugging Face) layout."""
        return self._file(name).array(name)

    @cached_property
    def tokenizer(self) -> HFTokenizer:
        tokenizer = HFTokenizer.from_directory(self.path)
        bos, eos = self.config.get("bos_token_id"), self.config.get("eos_token_id")
        if tokenizer.bos_id is None and isinstance(bos, int):
            tokenizer.bos_id = bos
        if tokenizer.eos_id is None and isinstance(eos, int):
            tokenizer.eos_id = eos
        return tokenizer

    @cached_property
    def generation_config(self) -> dict[str, Any]:
        file = self.path / "generation_config.json"
        return _read_json(file) if file.is_file() else {}

    def __repr__(self) -> str:
        return (f"HFCheckpoint({self.path}, model_type={self.config.get('model_type')!r}, "
                f"{len(self._where)} tensors in {len(self._files)} file(s))")


def open_hf_directory(path: str | os.PathLike[str]) -> HFCheckpoint:
    """Open a model directory (single `model.safetensors` or a sharded index)."""
    folder = Path(path)
    if not (folder / CONFIG).is_file():
        raise CheckpointError(f"{folder}: not a Hugging Face model directory (no {CONFIG})")
    config = _read_json(folder / CONFIG)
    if not isinstance(config, dict):
        raise CheckpointError(f"{folder / CONFIG}: expected a JSON object")
    files: dict[str, SafetensorsFile] = {}
    weight_map: dict[str, str] = {}
    if (folder / INDEX).is_file():
        index = _read_json(folder / INDEX)
        mapping = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(mapping, dict) or not mapping:
            raise CheckpointError(f"{folder / INDEX}: no weight_map")
        for filename in sorted(set(mapping.values())):
            shard = folder / str(filename)
            if Path(str(filename)).name != str(filename) or not shard.is_file():
                raise CheckpointError(f"{folder / INDEX}: shard {filename!r} is missing")
            files[filename] = SafetensorsFile(shard)
        for name, filename in mapping.items():
            if name not in files[filename]:
                raise MissingTensorError(
                    f"{folder / INDEX}: tensor {name!r} is mapped to {filename}, "
                    f"which does not hold it"
                )
            weight_map[name] = filename
    elif (folder / SINGLE).is_file():
        files[SINGLE] = SafetensorsFile(folder / SINGLE)
        weight_map = {name: SINGLE for name in files[SINGLE].names()}
    else:
        raise CheckpointError(
            f"{folder}: no {SINGLE} or {INDEX} (only safetensors weights are supported)"
        )
    return HFCheckpoint(folder, config, files, weight_map)
