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
Big-endian files are refused (`GGUFFormatError`, a `ValueError`, as every other
malformation).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GGUFFormatError

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
    """`values` (key -> str / int / float / bool / list), `tensors`, the memory map `data`.

    Every tensor is checked before any of its bytes is read, so a malformed file is a
    `GGUFFormatError` naming the tensor and the byte offset, never a fault inside a read of
    the map: a known ggml type, a shape of whole blocks, an aligned offset, bytes inside the
    file, and no overlap with the next tensor (a byte size that disagrees with the type and
    shape shows as one)."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        self.data = np.memmap(path, mode="r")
        try:
            self._read(gguf, _Cursor(memoryview(self.data)))
        except struct.error:
            raise self._error("truncated GGUF file: the header or tensor directory runs past "
                              f"the end of the file ({self.data.size} bytes)") from None
        except ValueError as error:
            if isinstance(error, GGUFFormatError):
                raise
            raise self._error(str(error)) from None

    def release_pages(self) -> None:
        """Drop this process's resident pages of the mapping; touched again, they are read
        back from the page cache."""
        mapping = self.data.base  # a memmap's base is its mmap.mmap
        if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):  # not everywhere
            try:
                mapping.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # pragma: no cover - platform without madvise
                pass

    def _error(self, message: str, tensor: str | None = None,
               offset: int | None = None) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: {message}", tensor, offset)

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
            entry_at = cursor.at
            name = cursor.string()
            n_dims = cursor.take("<I")
            if not 1 <= n_dims <= 4:
                raise self._error(f"tensor {name!r} (directory entry at byte {entry_at}) has "
                                  f"{n_dims} dimensions (1 to 4)", name, entry_at)
            dims = [cursor.take("<Q") for _ in range(n_dims)]
            directory.append((name, dims, cursor.take("<I"), cursor.take("<Q"), entry_at))
        alignment = int(self.values.get("general.alignment", 32))
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment} is not a power of two")
        start = -(-cursor.at // alignment) * alignment
        self.tensors = [self._tensor(gguf, start, alignment, *entry) for entry in directory]
        self._check_overlaps(start, directory)

    def _tensor(self, gguf: Any, start: int, alignment: int, name: str, dims: list[int],
                kind: int, offset: int, entry_at: int) -> GGUFTensor:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
            block, size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise self._error(f"tensor {name!r} (directory entry at byte {entry_at}) has "
                              f"unknown ggml type {kind}", name, entry_at) from None
        first = start + offset
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if count <= 0 or count % block or (dims and dims[0] % block):
            raise self._error(f"tensor {name!r} at byte {first}: shape {dims} does not divide "
                              f"into whole {qtype.name} blocks of {block} values along its "
                              f"rows", name, first)
        if offset % alignment:
            raise self._error(f"tensor {name!r}: data offset {offset} is not a multiple of "
                              f"the alignment {alignment}", name, first)
        nbytes = count // block * size
        if first + nbytes > self.data.size:
            raise self._error(f"tensor {name!r} ({qtype.name} {dims}) needs {nbytes} bytes at "
                              f"byte {first}, past the end of the file ({self.data.size} "
                              f"bytes): truncated?", name, first)
        raw = self.data[first : first + nbytes]
        shape = tuple(reversed(dims))
        if qtype.name in _FLOAT_TYPES:
            data = raw.view(_FLOAT_TYPES[qtype.name]).reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], dims[0] // block * size)
        return GGUFTensor(name, np.array(dims, np.uint64), qtype, data)

    def _check_overlaps(self, start: int, directory: list) -> None:
        spans = sorted((start + entry[3], tensor.data.nbytes, tensor.name, tensor)
                       for entry, tensor in zip(directory, self.tensors, strict=True))
        for (first, size, name, tensor), (next_first, _, next_name, _) in zip(spans, spans[1:],
                                                                          strict=False):
            if first + size > next_first:
                kind = tensor.tensor_type.name
                dims = tensor.shape.tolist()
                raise self._error(
                    f"tensor {name!r} ({kind} {dims}) needs {size} bytes at byte {first}, but "
                    f"tensor {next_name!r} starts at byte {next_first}: its byte size "
                    f"disagrees with its type and shape", name, first)
