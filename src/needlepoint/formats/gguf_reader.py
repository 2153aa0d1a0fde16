"""A GGUF file's metadata and tensor directory, read directly (little-endian GGUF v2 / v3).

The `gguf` package's `GGUFReader` keeps every metadata value as numpy views into the file (a
49k-token vocabulary with its merges is hundreds of thousands of small arrays: seconds to build
and over 150 MB resident). Here the metadata is decoded once into plain Python values and the
file stays one read-only memory map; tensors are views of it, shaped as `GGUFReader` shapes
them (quantised types `uint8 [..., row bytes]`, float types typed) so every decoder reads them
unchanged. Layout (llama.cpp's `gguf.md`): magic "GGUF", version u32, tensor count u64, kv
count u64; each kv: key (u64 length + UTF-8), value type u32, value (arrays: element type u32,
count u64, elements; strings: u64 length + bytes); each tensor: name, n_dims u32, dims u64
(ggml order, ne0 first), type u32, offset u64; the data at the next multiple of
`general.alignment` (32 by default) after the directory, each tensor at its offset.
Big-endian files are refused (`ValueError`, as every other malformation).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_FLOAT_TYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2",
                "I32": "<i4", "I64": "<i8"}  # BF16: uint8 rows, as GGUFReader


@dataclass
class GGUFTensor:
    """One tensor: `name`, `shape` (ggml order, ne0 first, a numpy array as GGUFReader's),
    `tensor_type` (`gguf.GGMLQuantizationType`), `data` (a view of the file)."""

    name: str
    shape: np.ndarray
    tensor_type: Any
    data: np.ndarray


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.at = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buffer, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.take("<Q")
        if size > len(self.buffer) - self.at:
            raise ValueError(f"string of {size} bytes past the end of the file at {self.at}")
        text = bytes(self.buffer[self.at : self.at + size]).decode("utf-8", "replace")
        self.at += size
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            value = self.take(_SCALARS[kind])
            return bool(value) if kind == 7 else value
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.at}")
        item, count = self.take("<I"), self.take("<Q")
        if item in _NUMPY:
            width = np.dtype(_NUMPY[item]).itemsize
            if count * width > len(self.buffer) - self.at:
                raise ValueError(f"array of {count} values past the end of the file")
            values = np.frombuffer(self.buffer, _NUMPY[item], count, self.at)
            self.at += count * width
            out = values.tolist()
            return [bool(v) for v in out] if item == 7 else out
        if item == STRING:  # vocabularies and merges: tens of thousands, read in one loop
            buffer, at, out = self.buffer, self.at, []
            for _ in range(count):
                (size,) = _U64.unpack_from(buffer, at)
                at += 8
                if at + size > len(buffer):
                    raise ValueError("string array past the end of the file")
                out.append(bytes(buffer[at : at + size]).decode("utf-8", "replace"))
                at += size
            self.at = at
            return out
        return [self.value(item) for _ in range(count)]


class GGUFFile:
    """`values` (key -> str / int / float / bool / list), `tensors`, the memory map `data`."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.data = np.memmap(path, mode="r")
        try:
            self._read(gguf, _Cursor(memoryview(self.data)))
        except struct.error as error:
            raise ValueError(f"truncated GGUF file: {error}") from None

    def _read(self, gguf: Any, cursor: _Cursor) -> None:
        if bytes(self.data[:4]) != MAGIC:
            raise ValueError("GGUF magic invalid")
        cursor.at = 4
        version = cursor.take("<I")
        if version & 0xFFFF == 0:
            raise ValueError("big-endian GGUF files are not supported")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = cursor.take("<Q"), cursor.take("<Q")
        self.values: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cursor.string()
            self.values[key] = cursor.value(cursor.take("<I"))
        directory = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = [cursor.take("<Q") for _ in range(cursor.take("<I"))]
            directory.append((name, dims, cursor.take("<I"), cursor.take("<Q")))
        alignment = int(self.values.get("general.alignment", 32))
        start = -(-cursor.at // alignment) * alignment
        self.tensors = [self._tensor(gguf, start, *entry) for entry in directory]

    def _tensor(self, gguf: Any, start: int, name: str, dims: list[int], kind: int,
                offset: int) -> GGUFTensor:
        qtype = gguf.GGMLQuantizationType(kind)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if count % block or (dims and dims[0] % block):
            raise ValueError(f"tensor {name!r}: {dims} is not whole {qtype.name} blocks")
        nbytes = count // block * size
        first = start + offset
        if first + nbytes > self.data.size:
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        raw = self.data[first : first + nbytes]
        shape = tuple(reversed(dims))
        if qtype.name in _FLOAT_TYPES:
            data = raw.view(_FLOAT_TYPES[qtype.name]).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], dims[0] // block * size)
        return GGUFTensor(name, np.array(dims, np.uint64), qtype, data)
