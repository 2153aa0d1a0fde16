"""`needlepoint inspect MODEL.cact --verify`: does every tensor decode to finite values?

A well-formed archive (sizes, offsets, header all consistent) can still hold corrupt weight
bytes: a flipped exponent bit makes a float16 NaN or infinity, and the model then computes
garbage (needlepoint raises `NonFiniteActivationError` when it sees non-finite logits).
`verify` decodes every float16/float32/CQ record, in blocks of rows so memory stays bounded
whatever the archive's size, and reports each tensor holding NaN or infinite values.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..formats.cact import CactArchive
from ..kernels.cq import dequantize_rows

BLOCK_VALUES = 1 << 20  # decoded float32 values per block: 4 MiB


def _blocks(archive: CactArchive, name: str) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, float32 block [rows, cols]) over one record."""
    record = archive.record(name)
    if record.dtype == "cq":
        cq = archive.cq(name)
        step = max(1, BLOCK_VALUES // max(1, cq.cols))
        for start in range(0, cq.rows, step):
            yield start, dequantize_rows(cq, slice(start, min(cq.rows, start + step)))
        return
    values = archive.array(name)
    rows = values.reshape(values.shape[0] if values.ndim else 1, -1)
    step = max(1, BLOCK_VALUES // max(1, rows.shape[1]))
    for start in range(0, rows.shape[0], step):
        yield start, rows[start : start + step].astype(np.float32)


def verify(archive: CactArchive) -> dict[str, Any]:
    """`{"tensors": checked, "values": decoded, "bad": [{"index", "name", "dtype",
    "non_finite", "first_row"}, ...]}`; raw records (tokenizer, permutations) are skipped."""
    bad: list[dict[str, Any]] = []
    checked = decoded = 0
    for record in archive.records:
        if record.dtype == "raw":
            continue
        checked += 1
        count, first = 0, None
        for start, block in _blocks(archive, record.name):
            decoded += block.size
            finite = np.isfinite(block)
            if not finite.all():
                count += int(block.size - np.count_nonzero(finite))
                if first is None:
                    first = start + int(np.flatnonzero(~finite.all(axis=1))[0])
        if count:
            bad.append({"index": record.index, "name": record.name, "dtype": record.dtype,
                        "non_finite": count, "first_row": first})
    return {"tensors": checked, "values": decoded, "bad": bad}


def describe(report: dict[str, Any]) -> str:
    """One line: all finite, or which tensors are not."""
    if not report["bad"]:
        return (f"verify: all {report['tensors']} tensors decode to finite values "
                f"({report['values']:,} values)")
    shown = ", ".join(f"{b['name']} (record {b['index']}: {b['non_finite']} non-finite "
                      f"values from row {b['first_row']})" for b in report["bad"][:5])
    more = f" and {len(report['bad']) - 5} more" if len(report["bad"]) > 5 else ""
    return (f"{len(report['bad'])} of {report['tensors']} tensors decode to NaN or infinite "
            f"values (corrupt weight bytes): {shown}{more}")
