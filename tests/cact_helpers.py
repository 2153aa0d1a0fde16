"""Shared pieces of the `.cact` reader tests (`test_cact_*.py`): the fixtures, the tiny
archives' bytes, directory offsets, `expect_error` (open, touch everything, check the error
names the field and byte offset) and `mutate`."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from conftest import NEEDLE2_FIXTURES, NEEDLE3_FIXTURES, get_fixture

from needlepoint import CactFormatError, open_archive
from needlepoint.formats.cact import RECORD_BYTES, CactArchive

ALL_FIXTURES = [("needle3", name) for name in NEEDLE3_FIXTURES] + [
    ("needle2", name) for name in NEEDLE2_FIXTURES
]
OFFSET_RE = re.compile(r"\(byte offset \d+\)")
_BYTES: dict[str, bytes] = {}


def tiny_bytes(generation: str) -> bytes:
    if generation not in _BYTES:
        _BYTES[generation] = get_fixture(generation, "tiny").cact.read_bytes()
    return _BYTES[generation]


def directory_start(archive: CactArchive) -> int:
    return archive.header_bytes + 4 * archive.config.codebook_len


def record_at(archive: CactArchive, name: str) -> int:
    """Byte offset of a named record in the directory."""
    return directory_start(archive) + archive.record(name).index * RECORD_BYTES


def sidecar_directory(fixture) -> list[dict]:
    meta = fixture.meta
    return meta["directory"] if fixture.generation == "needle3" else meta["archive"]["tensors"]


def expect_error(data: bytes | bytearray, field: str, offset: int | None = None, *, tmp_path=None):
    """Open (and fully touch) the archive; it must fail with a message naming `field` and,
    when given, the byte offset. Goes through a real file when tmp_path is given."""
    source: object = bytes(data)
    if tmp_path is not None:
        source = tmp_path / "mutated.cact"
        source.write_bytes(bytes(data))
    with pytest.raises(CactFormatError) as info:
        touch_everything(open_archive(source))
    message = str(info.value)
    assert field in message, message
    assert OFFSET_RE.search(message), message
    if offset is not None:
        assert f"(byte offset {offset})" in message, message
    return message


def touch_everything(archive: CactArchive) -> None:
    """Decode every tensor and the tokenizer: what "the archive works" means."""
    with np.errstate(all="ignore"):  # mutated FP16 weights may be inf/NaN: that is data
        for record in archive.records:
            if record.dtype != "raw":
                values = archive.floats(record.name)
                assert values.shape == record.shape
                assert values.dtype == np.float32
    assert archive.tokenizer.vocab_size > 0


def mutate(data: bytes, offset: int, fmt: str, *values) -> bytearray:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return out


def cq_samples(fixture, archive: CactArchive):
    """(key, tensor, rows) of every upstream dequantisation sample `deq_<tensor>` of a CQ
    tensor in `fixture`: rows is the number of leading rows sampled (`_rows0to<N>`), or None
    for the whole matrix."""
    for key in fixture.arrays.files:
        if not key.startswith("deq_"):
            continue
        tensor = key[4:].replace("__", ".")
        rows = None
        match = re.match(r"(.*)_rows0to(\d+)", tensor)
        if match:
            tensor, rows = match.group(1), int(match.group(2)) + 1
        if archive.record(tensor).dtype == "cq":
            yield key, tensor, rows
