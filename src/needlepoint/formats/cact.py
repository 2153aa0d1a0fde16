"""Reader for Cactus `.cact` archives (Needle 3 tag 0x05E12A84, Needle 2 tag 0x05E12A83).

Layout (fixture READMEs, "The `.cact` archive" / "The v2 `.cact` layout"): header, codebooks,
a directory of 44-byte records, then 64-byte-aligned blobs. Records carry no names: their
order is fixed by the geometry, so names come from `needle3_geometry.tensor_layout` /
`needle2_geometry.tensor_layout` plus the probe-head manifest.

The file is memory-mapped and every tensor is a zero-copy numpy view; nothing is decoded until
it is asked for. Every inconsistency is a `CactFormatError` naming the field and byte offset.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TokenizerError
from ..kernels.cq_tensor import CQTensor
from ..kernels.wtypes import TYPES, WeightType, cq_bytes, cq_type
from . import needle2_geometry as v2config
from . import needle3_geometry as v3config
from .cact_checks import HEADER_OFFSETS, RECORD_BYTES, validate_header
from .cact_checks import header_error as _fail
from .cact_records import DTYPE_NAMES, TensorRecord, check_disjoint, check_record
from .geometry_common import unpack_words

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

RECORD_STRUCT = struct.Struct("<BBH4IQQII")
CODEBOOK_SIZES = {2: 4, 3: 8, 4: 16}
MAX_TENSORS = 1 << 16
# Fewest directory records one transformer block can have (Needle 2: 14; Needle 3: 24).
MIN_LAYER_RECORDS = {2: 14, 3: 24}


class CactArchive:
    """A memory-mapped `.cact` archive. Use `open_archive(path)`."""

    def __init__(self, source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> None:
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.path = Path("<bytes>")
            self._buffer = _from_bytes(source)
        else:
            self.path = Path(source)
            self._buffer = _map_file(self.path)
        self.size = len(self._buffer)
        self.generation, self.config = self._read_header()
        self.codebooks = self._read_codebooks()
        self.records = self._read_directory()
        self._by_name = {record.name: record for record in self.records}

    # -- header -------------------------------------------------------------------------------
    def _read_header(self) -> tuple[int, Any]:
        if self.size < 4:
            raise _fail(
                "header.tag", 0, f"truncated: file is {self.size} bytes, too short for a header"
            )
        (tag,) = struct.unpack_from("<I", self._buffer, 0)
        if tag == v3config.FORMAT_TAG:
            module, config_class, generation = v3config, v3config.V3Config, 3
        elif tag == v2config.FORMAT_TAG:
            module, config_class, generation = v2config, v2config.V2Config, 2
        else:
            raise _fail("header.tag", 0, f"unknown format tag 0x{tag:08X} (not a Needle archive)")
        if self.size < module.HEADER_BYTES:
            raise _fail(
                "header", 0, f"truncated: {self.size} bytes, header needs {module.HEADER_BYTES}"
            )
        words, rope_theta = unpack_words(self._buffer, module.HEADER_U32)
        values = module.parse_header(words, rope_theta)
        validate_header(values, generation)
        if generation == 3:
            mask = words[17] | (words[18] << 32)
            if mask >> min(values["num_layers"], 64):
                raise _fail(
                    "header.global_layers", 68,
                    f"global-layer mask 0x{mask:X} names a layer beyond the last "
                    f"({values['num_layers']} layers)",
                )
        kwargs = {f.name: values[f.name] for f in fields(config_class) if f.name in values}
        return generation, config_class(**kwargs)

    @property
    def header_bytes(self) -> int:
        return v3config.HEADER_BYTES if self.generation == 3 else v2config.HEADER_BYTES

    def _read_codebooks(self) -> dict[int, np.ndarray]:
        start = self.header_bytes
        length = self.config.codebook_len
        if length != sum(CODEBOOK_SIZES.values()):
            raise _fail("header.codebook_len", 8, f"expected 28 (4+8+16 entries), got {length}")
        if start + 4 * length > self.size:
            raise _fail("codebooks", start, "truncated: file ends inside the codebooks")
        flat = np.frombuffer(self._buffer, dtype="<f4", count=length, offset=start)
        if not np.all(np.isfinite(flat)):
            raise _fail("codebooks", start, "non-finite codebook value")
        books: dict[int, np.ndarray] = {}
        cursor = 0
        for bits, count in CODEBOOK_SIZES.items():
            books[bits] = flat[cursor : cursor + count].astype(np.float32)
            cursor += count
        # Binary and ternary are defined by the format rather than stored (README "CQ tensors").
        root = np.float32(np.sqrt(128.0))
        books[1] = np.array([-1.0, 1.0], np.float32) * np.float32(np.sqrt(2 / np.pi)) / root
        ternary = np.float32(1.2240064) / root
        books[5] = np.array([0.0, ternary, 0.0, -ternary], np.float32)
        return books

    # -- directory ----------------------------------------------------------------------------
    def _expected_layout(self) -> list[tuple[str, str, tuple[int, ...]]]:
        module = v3config if self.generation == 3 else v2config
        return module.tensor_layout(self.config)

    def _read_directory(self) -> list[TensorRecord]:
        cfg = self.config
        dir_start = self.header_bytes + 4 * cfg.codebook_len
        count = cfg.num_tensors
        if not 2 <= count <= MAX_TENSORS:
            raise _fail("header.num_tensors", 4, f"implausible tensor count {count}")
        # Bound the layer count by the record count before building a per-layer layout.
        if cfg.num_layers * MIN_LAYER_RECORDS[self.generation] + 2 > count:
            raise _fail(
                "header.num_layers", HEADER_OFFSETS[self.generation]["num_layers"],
                f"{cfg.num_layers} layers need more records than num_tensors = {count}",
            )
        if dir_start + count * RECORD_BYTES > self.size:
            raise _fail(
                "directory",
                dir_start,
                f"truncated: {count} records need {count * RECORD_BYTES} bytes, file has "
                f"{max(0, self.size - dir_start)} after the codebooks",
            )
        data_start = dir_start + count * RECORD_BYTES
        raw = [
            (where, RECORD_STRUCT.unpack_from(self._buffer, where))
            for where in range(dir_start, data_start, RECORD_BYTES)
        ]
        layout = self._expected_layout()
        if count < len(layout) + 1:
            raise _fail(
                "header.num_tensors", 4, f"{count} records, but the geometry needs at least "
                f"{len(layout) + 1} (through final_norm, plus the tokenizer)"
            )
        records: list[TensorRecord] = []
        for index, (name, dtype, shape) in enumerate(layout):
            records.append(
                check_record(self.size, index, raw[index], name, dtype, shape, data_start)
            )
        records += self._read_heads(raw, len(layout), count - 1, data_start)
        records.append(
            check_record(self.size, count - 1, raw[-1], "tokenizer", "raw", None, data_start)
        )
        check_disjoint(records, dir_start)
        return records

    def _read_heads(
        self, raw: list, first: int, end: int, data_start: int
    ) -> list[TensorRecord]:
        """Probe-head records between `final_norm` and the tokenizer, named from the manifest."""
        if first == end:
            return []
        manifest = check_record(
            self.size, first, raw[first], "heads.manifest", "fp16", None, data_start
        )
        where = raw[first][0]
        if manifest.dtype not in ("fp16", "fp32"):
            raise _fail(
                f"directory[{first}] (heads.manifest).dtype", where,
                f"the head manifest must be FP16 codes, found {manifest.dtype}",
            )
        if len(manifest.shape) != 1:
            raise _fail(
                f"directory[{first}] (heads.manifest).ndim", where + 1,
                f"the head manifest must be a vector, found shape {manifest.shape}",
            )
        codes = self._view(manifest).astype(np.float32)
        width = manifest.nbytes // len(codes)
        module = v3config if self.generation == 3 else v2config
        names: list[str] = []
        previous = 0
        for position, code in enumerate(codes.tolist()):
            head = module.HEAD_CODES.get(int(code)) if np.isfinite(code) else None
            if head is None or code != int(code):
                raise _fail(
                    f"heads.manifest[{position}]",
                    manifest.offset + width * position,
                    f"unknown head code {code!r}",
                )
            if code <= previous:
                raise _fail(
                    f"heads.manifest[{position}]",
                    manifest.offset + width * position,
                    f"head code {int(code)} repeats or is out of order (codes ascend)",
                )
            previous = code
            parts = list(module.HEAD_RECORDS)
            if head == "router_head":
                parts += list(v3config.ROUTER_EXTRA)
            names += [f"{head}.{part}" for part in parts]
        if first + 1 + len(names) != end:
            raise _fail(
                "header.num_tensors", 4,
                f"manifest lists heads needing {len(names)} records, archive has {end - first - 1}",
            )
        out = [manifest]
        for offset, name in enumerate(names, start=first + 1):
            kind = "cq" if self._record_dtype(raw[offset]) == "cq" else "fp16"
            out.append(check_record(self.size, offset, raw[offset], name, kind, None, data_start))
        return out

    @staticmethod
    def _record_dtype(raw_record: tuple) -> str:
        return DTYPE_NAMES.get(raw_record[1][0], "?")

    # -- access -------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [record.name for record in self.records]

    def has(self, name: str) -> bool:
        return name in self._by_name

    def record(self, name: str) -> TensorRecord:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"archive {self.path.name} has no tensor {name!r}") from None

    def _view(self, record: TensorRecord) -> np.ndarray:
        if record.dtype == "fp16":
            return np.frombuffer(
                self._buffer, "<f2", count=record.nbytes // 2, offset=record.offset
            ).reshape(record.shape)
        if record.dtype == "fp32":
            return np.frombuffer(
                self._buffer, "<f4", count=record.nbytes // 4, offset=record.offset
            ).reshape(record.shape)
        return np.frombuffer(self._buffer, np.uint8, count=record.nbytes, offset=record.offset)

    def array(self, name: str) -> np.ndarray:
        """Zero-copy view of an FP16/FP32/RAW record (FP16 stays FP16: cast where used)."""
        record = self.record(name)
        if record.dtype == "cq":
            raise TypeError(f"{name} is a CQ tensor: use .cq({name!r}) or kernels.cq.dequantize")
        return self._view(record)

    def floats(self, name: str) -> np.ndarray:
        """A record as float32 (CQ records are dequantised)."""
        record = self.record(name)
        if record.dtype == "cq":
            return self.wtype(name).dequantize(self.cq(name)).reshape(record.shape)
        return self._view(record).astype(np.float32)

    def cq(self, name: str) -> CQTensor:
        """Zero-copy packed view of a CQ record (2-D: trailing dims are the reduction axis)."""
        record = self.record(name)
        if record.dtype != "cq":
            raise TypeError(f"{name} is {record.dtype}, not CQ")
        rows = record.shape[0]
        cols = int(np.prod(record.shape[1:])) if len(record.shape) > 1 else 1
        row_bytes, groups = cq_bytes(cq_type(record.bits), rows, cols, record.group)
        blob = self._view(record)
        packed = blob[: rows * row_bytes].reshape(rows, row_bytes)
        norms = np.frombuffer(
            self._buffer, "<f2", count=rows * groups, offset=record.offset + rows * row_bytes,
        ).reshape(rows, groups)
        return CQTensor(
            record.name, rows, cols, record.bits, record.group, packed, norms,
            self.codebooks[record.bits],
        )

    def wtype(self, name: str) -> WeightType:
        """The weight type of a matrix record (`kernels.wtypes`): its CQ type by the record's
        `bits` code, or F16 / F32."""
        record = self.record(name)
        if record.dtype == "cq":
            return cq_type(record.bits)
        if record.dtype == "raw":
            raise TypeError(f"{name} is a RAW record, not a matrix")
        return TYPES[record.dtype.upper()]

    def table(self, name: str) -> CQTensor | np.ndarray:
        """A row-gathered table as stored: the CQ tensor, or the FP16/FP32 view; its rows are
        `self.wtype(name).gather(table, rows)`."""
        return self.cq(name) if self.wtype(name).kind == "cq" else self.array(name)

    @property
    def directory_end(self) -> int:
        """Offset of the first byte after the header, codebooks and directory."""
        return self.header_bytes + 4 * self.config.codebook_len + RECORD_BYTES * len(self.records)

    def span(self, start: int, end: int) -> bytes:
        """A copy of the archive's bytes [start, end) (clipped to the file)."""
        return bytes(self._buffer[max(0, start) : min(self.size, end)])

    def release(self, names: list[str]) -> None:
        """Drop the named records' pages from this process's resident set (they stay in the
        page cache and fault back in if read again): for blobs only read while building
        weights. A no-op for archives held as bytes, or where madvise is unavailable."""
        if not isinstance(self._buffer, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        for name in names:
            record = self.record(name)
            start = -(-record.offset // page) * page  # whole pages inside the blob only
            end = (record.offset + record.nbytes) // page * page
            if end > start:
                self._buffer.madvise(mmap.MADV_DONTNEED, start, end - start)

    @property
    def tokenizer_blob(self) -> memoryview:
        record = self.records[-1]
        return memoryview(self._buffer)[record.offset : record.offset + record.nbytes]

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The archive's own tokenizer, built from its blob on first use."""
        from .tokenizer import Tokenizer

        record = self.records[-1]
        try:
            return Tokenizer.from_blob(self.tokenizer_blob)
        except TokenizerError as error:
            raise _fail(
                f"directory[{record.index}] (tokenizer)", record.offset, f"corrupt blob: {error}"
            ) from error

    @property
    def heads(self) -> tuple[str, ...]:
        """Probe heads present, in manifest order (e.g. ("confidence_head",))."""
        seen: list[str] = []
        for record in self.records:
            if record.name.endswith("_head.probes"):
                seen.append(record.name.split(".")[0])
        return tuple(seen)

    def __repr__(self) -> str:
        count = len(self.records)
        return f"CactArchive({str(self.path)!r}, needle{self.generation}, {count} tensors)"


def _from_bytes(data: bytes | bytearray | memoryview) -> bytes:
    buffer = bytes(data)
    if not buffer:
        raise _fail("header.tag", 0, "empty input: 0 bytes, not a .cact archive")
    return buffer


def _map_file(path: Path) -> mmap.mmap:
    if path.is_dir():
        raise _fail("header.tag", 0, f"{path} is a directory, not a .cact archive")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                raise _fail("header.tag", 0, f"{path} is an empty file (0 bytes)")
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except IsADirectoryError as error:
        raise _fail("header.tag", 0, f"{path} is a directory, not a .cact archive") from error


def open_archive(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> CactArchive:
    """Open and validate a `.cact` archive.

    `source` is a path (the file is memory-mapped; tensors decode on demand) or the archive's
    bytes. Any malformed input raises `CactFormatError`; a missing file `FileNotFoundError`.
    """
    return CactArchive(source)
