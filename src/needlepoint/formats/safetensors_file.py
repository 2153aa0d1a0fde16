"""One `.safetensors` file, memory-mapped: tensor names, shapes, and float32 arrays.

Layout (`shared/fixtures/hf/README.md`, "Files of a model directory"): an 8-byte little-endian
header length N, an N-byte JSON header mapping each tensor name to `{dtype, shape,
data_offsets}` (offsets relative to the end of the header) plus optional `__metadata__`, then the
row-major little-endian data. The `safetensors` library validates the file when it is opened
(header JSON, offsets in bounds and consistent with dtype x shape); the data region is then mapped
read-only with numpy, so an F32 tensor is a zero-copy view of the file and F16/BF16 tensors are
converted to float32 on request.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import CheckpointError, MissingTensorError, UnsupportedTensorTypeError
from .hf_extra import hf_extra

_NUMPY_TYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
FLOAT_TYPES = tuple(_NUMPY_TYPES)


def _safe_open(path: Path):
    with hf_extra("reading .safetensors needs the `safetensors` package", CheckpointError):
        from safetensors import safe_open
    try:
        return safe_open(str(path), framework="numpy")
    except Exception as error:  # the library raises its own SafetensorError / OSError types
        raise CheckpointError(f"{path}: not a valid safetensors file: {error}") from None


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32: the upper half of a float32."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


class SafetensorsFile:
    """A validated, memory-mapped `.safetensors` file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        handle = _safe_open(self.path)
        self.metadata = handle.metadata() or {}
        with open(self.path, "rb") as raw:
            (length,) = struct.unpack("<Q", raw.read(8))
            header = json.loads(raw.read(length))
        header.pop("__metadata__", None)
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name in handle.keys():
            entry = header[name]
            begin, end = entry["data_offsets"]
            self._entries[name] = (entry["dtype"], tuple(entry["shape"]), begin, end)
        self._data_start = 8 + length
        size = self.path.stat().st_size - self._data_start
        self._data = (
            np.memmap(self.path, np.uint8, "r", offset=self._data_start, shape=(size,))
            if size > 0
            else np.zeros(0, np.uint8)
        )

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def _entry(self, name: str) -> tuple[str, tuple[int, ...], int, int]:
        try:
            return self._entries[name]
        except KeyError:
            raise MissingTensorError(f"{self.path.name}: no tensor {name!r}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name)[1]

    def dtype(self, name: str) -> str:
        return self._entry(name)[0]

    def array(self, name: str) -> np.ndarray:
        """The tensor as float32 (F32: a read-only view of the mapped file)."""
        dtype, shape, begin, end = self._entry(name)
        kind = _NUMPY_TYPES.get(dtype)
        if kind is None:
            raise UnsupportedTensorTypeError(
                f"{self.path.name}: tensor {name!r} has dtype {dtype}; "
                f"supported: {', '.join(FLOAT_TYPES)}"
            )
        raw = self._data[begin:end].view(kind).reshape(shape)
        if dtype == "F32":
            return raw
        if dtype == "BF16":
            return bf16_to_f32(raw)
        return raw.astype(np.float32)

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path.name}, {len(self._entries)} tensors)"
