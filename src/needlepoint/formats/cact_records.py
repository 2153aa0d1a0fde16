"""Directory records of a `.cact` archive (fixture READMEs, "Directory"): the typed record, the
checks each one must pass before any view of its blob is made, and the check across records
that no two blobs overlap (here, beside the record type, so `cact_checks` needs no record and
the three reader modules import one way)."""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.wtypes import CQ_CODES
from .cact_checks import MAX_DIM, RECORD_BYTES, expected_nbytes
from .cact_checks import header_error as _fail

DTYPE_NAMES = {1: "fp16", 2: "fp32", 3: "cq", 4: "raw"}
# Blobs start at 64-byte aligned offsets (both READMEs), one after another, never overlapping.
BLOB_ALIGN = 64


@dataclass(frozen=True)
class TensorRecord:
    """One directory record, with the name its position implies."""

    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    group: int
    bits: int


def check_record(
    file_size: int,
    index: int,
    raw_record: tuple,
    name: str,
    dtype: str,
    shape: tuple[int, ...] | None,
    data_start: int,
) -> TensorRecord:
    """Record `index` of the directory, checked against the expected dtype, shape and the
    file's data region; every failure names the field and its byte offset."""
    where, (code, ndim, _pad, s0, s1, s2, s3, offset, nbytes, group, bits) = raw_record
    field = f"directory[{index}] ({name})"
    got_dtype = DTYPE_NAMES.get(code)
    if got_dtype is None:
        raise _fail(field + ".dtype", where, f"unknown dtype code {code}")
    # Shipped archives may store any matrix as CQ at any width, or FP16 where small.
    allowed = {dtype} | ({"cq", "fp16", "fp32"} if dtype in ("cq", "fp16") else set())
    if got_dtype not in allowed:
        raise _fail(field + ".dtype", where, f"expected {dtype}, found {got_dtype}")
    if ndim > 4:
        raise _fail(field + ".ndim", where + 1, f"ndim {ndim} > 4")
    got_shape = (s0, s1, s2, s3)[:ndim]
    if any(dim == 0 or dim > MAX_DIM for dim in got_shape):
        raise _fail(field + ".shape", where + 4, f"implausible shape {got_shape}")
    if shape is not None and got_shape != shape:
        raise _fail(
            field + ".shape", where + 4, f"shape {got_shape} does not match geometry {shape}"
        )
    if data_start <= offset < file_size < offset + nbytes:
        raise _fail(
            field + ".nbytes",
            where + 28,
            f"blob [{offset}, {offset + nbytes}) runs past the end of the "
            f"{file_size}-byte file (truncated?)",
        )
    if offset < data_start or offset + nbytes > file_size:
        raise _fail(
            field + ".offset",
            where + 20,
            f"blob [{offset}, {offset + nbytes}) lies outside the data region "
            f"[{data_start}, {file_size})",
        )
    if offset % BLOB_ALIGN:
        raise _fail(
            field + ".offset", where + 20, f"blob offset {offset} is not 64-byte aligned"
        )
    if got_dtype == "cq" and bits not in CQ_CODES:
        raise _fail(field + ".bits", where + 40, f"unsupported CQ width {bits} bits")
    if got_dtype == "cq" and (group < 8 or group & (group - 1) or group > 4096):
        raise _fail(
            field + ".group", where + 36, f"CQ group {group} is not a power of two in [8, 4096]"
        )
    expected = expected_nbytes(got_dtype, got_shape, group, bits)
    if expected is not None and expected != nbytes:
        raise _fail(
            field + ".nbytes",
            where + 28,
            f"{nbytes} bytes, but {got_dtype} {got_shape}"
            + (f" at {bits} bits, group {group}" if got_dtype == "cq" else "")
            + f" needs {expected}",
        )
    return TensorRecord(index, name, got_dtype, got_shape, offset, nbytes, group, bits)


def check_disjoint(records: list[TensorRecord], dir_start: int) -> None:
    """No two blobs may share a byte: an offset pointing into another tensor is corruption."""
    ordered = sorted(records, key=lambda record: record.offset)
    for before, after in zip(ordered, ordered[1:], strict=False):
        if before.offset + before.nbytes > after.offset:
            raise _fail(
                f"directory[{after.index}] ({after.name}).offset",
                dir_start + after.index * RECORD_BYTES + 20,
                f"blob [{after.offset}, {after.offset + after.nbytes}) overlaps "
                f"{before.name} [{before.offset}, {before.offset + before.nbytes})",
            )
