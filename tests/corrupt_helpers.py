"""Well-formed archives with corrupt weight bytes: a copy of the toy model in which one
tensor's stored values are overwritten with float16 NaN (0x7E00), everything else (header,
directory, sizes, checksums of structure) untouched, so the archive still opens."""

from __future__ import annotations

from pathlib import Path

from conftest import toy_model_path

import needlepoint

FP16_NAN = b"\x00\x7e"  # little-endian 0x7E00


def corrupt_copy(folder: Path, tensor: str = "layer01.w1b", values: int = 16) -> Path:
    """A copy of the toy archive in `folder` whose tensor `tensor` has its first `values`
    float16 values (for a CQ tensor: its first norms) set to NaN."""
    source = toy_model_path()
    record = needlepoint.open_archive(source).record(tensor)
    data = bytearray(source.read_bytes())
    start = record.offset
    if record.dtype == "cq":  # norms follow the packed indices
        archive = needlepoint.open_archive(source)
        start += archive.cq(tensor).packed.nbytes
    count = min(values, (record.offset + record.nbytes - start) // 2)
    data[start : start + 2 * count] = FP16_NAN * count
    path = folder / f"corrupt-{tensor}.cact"
    path.write_bytes(bytes(data))
    return path
