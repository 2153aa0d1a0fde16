"""Cactus-Quants (CQ) weights: unpack, dequantise, and multiply (fixture README "CQ tensors").

A CQ row is split into groups of `group` (128) columns; group j of row r holds `bits`-bit
codebook indices `idx` and one FP16 norm, and dequantises to `(codebook[idx] * norm) @ H`,
H the normalised Sylvester Hadamard matrix. Two equivalent ways to multiply follow from H
being symmetric and orthonormal:

* dequantise once (`dequantize`) and use BLAS on the float matrix, or
* keep weights in the rotated domain (`rotated_weights` = codebook[idx] * norm, no Hadamard)
  and rotate the activations instead (`fwht_groups`), which is what `matmul` does.
"""

from __future__ import annotations

import numpy as np

from . import pinned
from .cq_tensor import CQTensor
from .fwht import fwht_groups, hadamard_matrix

# The normalised Hadamard entry +-h of a 128 group: float32(1 / sqrt(128)), as `hadamard_matrix`.
_H128 = float(hadamard_matrix(pinned.GROUP)[0, 0])
# Scratch for `rotated_into`: a few groups of gathered values, sized to stay in L2.
SCRATCH_BYTES = 1 << 20


def unpack_indices(cq: CQTensor, rows: np.ndarray | slice | None = None) -> np.ndarray:
    """Codebook indices as uint8 [rows, in_pad], from the LSB-first per-row bit stream."""
    packed = cq.packed if rows is None else cq.packed[rows]
    width = cq.storage_bits
    count = packed.shape[0]
    if width == 4:
        out = np.empty((count, packed.shape[1], 2), np.uint8)
        np.bitwise_and(packed, 0x0F, out=out[:, :, 0])  # low nibble = even column
        np.right_shift(packed, 4, out=out[:, :, 1])
        return out.reshape(count, -1)
    if width == 2:
        out = np.empty((count, packed.shape[1], 4), np.uint8)
        for slot in range(4):  # column 4b+slot = (byte >> 2*slot) & 3
            np.bitwise_and(np.right_shift(packed, 2 * slot), 3, out=out[:, :, slot])
        return out.reshape(count, -1)
    bits = np.unpackbits(packed, axis=1, bitorder="little")
    if width == 1:
        return bits
    weights = (1 << np.arange(width, dtype=np.uint8)).astype(np.uint8)
    return (bits.reshape(count, -1, width) * weights).sum(axis=2, dtype=np.uint8)


def rotated_weights(
    cq: CQTensor, rows: np.ndarray | slice | None = None, pad: bool = True
) -> np.ndarray:
    """`codebook[idx] * norm` as float32 [rows, in_pad]: the weights in the Hadamard domain."""
    norms = (cq.norms if rows is None else cq.norms[rows]).astype(np.float32)
    lut = byte_lut(cq)
    if lut is not None:  # one gather per packed byte: the same floats as codebook[idx]
        packed = cq.packed if rows is None else cq.packed[rows]
        values = lut[packed].reshape(packed.shape[0], -1, cq.group)
    else:
        idx = unpack_indices(cq, rows)
        values = cq.codebook[idx].reshape(idx.shape[0], -1, cq.group)
    values *= norms[:, :, None]
    return values.reshape(values.shape[0], -1)


def rotated_into(
    cq: CQTensor, out: np.ndarray, rows: np.ndarray | slice | None = None
) -> np.ndarray:
    """Write `rotated_weights(cq, rows).T` into `out` [in_pad, len(rows)], bit for bit, with no
    full-size float temporary: `out` may be a column slice of a larger C-contiguous matrix (a
    fused weight built in place). The transpose is done on the packed bytes (1/16 of the floats
    at 2 bits); then, a few groups at a time (an L2-sized scratch), each index slot of a byte
    is one byte-LUT gather and one multiply by the group norms straight into `out`."""
    packed = cq.packed if rows is None else cq.packed[rows]
    count = packed.shape[0]
    if out.shape != (cq.in_pad, count):
        raise ValueError(f"{cq.name}: out shape {out.shape} != {(cq.in_pad, count)}")
    lut = byte_lut(cq)
    if lut is None or count == 0:
        out[...] = rotated_weights(cq, rows).T
        return out
    per = lut.shape[1]
    per_group = cq.group // per  # packed bytes per group
    groups = packed.shape[1] // per_group
    columns = np.ascontiguousarray(packed.T).reshape(groups, per_group, count)
    norms = cq.norms if rows is None else cq.norms[rows]
    scale = norms.T.astype(np.float32)[:, None, :]  # [groups, 1, count]
    slots = out.reshape(groups, per_group, per, count)  # in-column = byte * per + slot
    step = max(1, SCRATCH_BYTES // (4 * per_group * count))
    scratch = np.empty((min(step, groups), per_group, count), np.float32)
    for first in range(0, groups, step):
        last = min(groups, first + step)
        values = scratch[: last - first]
        for slot in range(per):
            # mode="clip": uint8 indices are always in range, and clip skips the checked copy
            np.take(_lut_column(lut, slot), columns[first:last], out=values, mode="clip")
            np.multiply(values, scale[first:last], out=slots[first:last, :, slot, :])
    return out


def table_rows(table: CQTensor | np.ndarray, rows: np.ndarray | list[int]) -> np.ndarray:
    """Rows of a row-gathered table as float32: dequantised CQ rows, or FP16/FP32 rows cast."""
    if isinstance(table, np.ndarray):
        return table[np.asarray(rows, np.intp)].astype(np.float32)
    return dequantize_rows(table, np.asarray(rows, np.intp))


def dequantize_rows(cq: CQTensor, rows: np.ndarray | slice | None = None) -> np.ndarray:
    """Dequantised float32 rows [len(rows), cols] (a row gather: embedding, engram tables).

    `R @ H` per group in one pinned order (`pinned.dequant_rows`: the fixtures' `deq_*`
    samples bit for bit on every machine), for the 128-wide groups of every fixture; other
    group sizes use a plain product."""
    values = rotated_weights(cq, rows)
    count = values.shape[0]
    if cq.group == pinned.GROUP:
        groups = pinned.dequant_rows(values.reshape(count, -1, cq.group), _H128)
    else:
        groups = values.reshape(count, -1, cq.group) @ hadamard_matrix(cq.group)
    return groups.reshape(count, -1)[:, : cq.cols]


def dequantize(cq: CQTensor) -> np.ndarray:
    """The whole matrix as float32 [rows, cols]."""
    return dequantize_rows(cq, None)


def dequantize_row(cq: CQTensor, row: int) -> np.ndarray:
    """One dequantised row, float32 [cols]."""
    if not -cq.rows <= row < cq.rows:
        raise IndexError(f"row {row} out of range for {cq.name} with {cq.rows} rows")
    return dequantize_rows(cq, slice(row, row + 1 if row != -1 else None))[0]


def matmul(cq: CQTensor, x: np.ndarray) -> np.ndarray:
    """`x @ W^T` for x [..., cols] -> [..., rows], via rotated activations (no dequantise)."""
    data = np.asarray(x, np.float32)
    if data.shape[-1] != cq.cols:
        raise ValueError(f"{cq.name}: input width {data.shape[-1]} != {cq.cols}")
    rotated = fwht_groups(data, cq.group)
    return rotated @ rotated_weights(cq).T


def matvec(cq: CQTensor, x: np.ndarray) -> np.ndarray:
    """`W @ x` for a single vector x [cols] -> [rows]."""
    return matmul(cq, np.asarray(x, np.float32)[None, :])[0]


# Byte lookup tables: one uint8 of packed indices -> its 8 / storage_bits codebook values.
_BYTE_LUTS: dict[tuple[int, bytes], np.ndarray] = {}


def byte_lut(cq: CQTensor) -> np.ndarray | None:
    """[256, 8 // storage_bits] float32 codebook values of every packed byte (LSB-first
    indices), for 2- and 4-bit storage; None for other widths. `byte_lut(cq)[packed]` is
    `cq.codebook[unpack_indices(cq)]` in one gather instead of several shift/mask passes."""
    width = cq.storage_bits
    if width not in (2, 4):
        return None
    key = (width, cq.codebook.astype(np.float32).tobytes())
    table = _BYTE_LUTS.get(key)
    if table is None:
        per = 8 // width
        codes = np.arange(256)[:, None] >> (width * np.arange(per))[None, :]
        table = np.asarray(cq.codebook, np.float32)[codes & ((1 << width) - 1)]
        table.setflags(write=False)
        _BYTE_LUTS[key] = table
    return table


_LUT_COLUMNS: dict[tuple[int, int], np.ndarray] = {}


def _lut_column(lut: np.ndarray, slot: int) -> np.ndarray:
    """Column `slot` of a byte LUT, contiguous (a 256-entry gather table)."""
    key = (id(lut), slot)
    column = _LUT_COLUMNS.get(key)
    if column is None:
        column = _LUT_COLUMNS[key] = np.ascontiguousarray(lut[:, slot])
    return column


def gather_rows(tensors: list[CQTensor], rows: np.ndarray | list[int]) -> np.ndarray:
    """`dequantize_rows(t, rows)` of several same-format tensors, as [len(tensors), len(rows),
    cols] (the same floats, in a few calls for all of them: engram lookups per decode step)."""
    index = np.asarray(rows, np.intp)
    first = tensors[0]
    lut = byte_lut(first)
    same = all(
        t.bits == first.bits and t.group == first.group and t.cols == first.cols
        and t.packed.shape[1] == first.packed.shape[1]
        and np.array_equal(t.codebook, first.codebook)
        for t in tensors
    )
    if lut is None or not same:
        return np.stack([dequantize_rows(t, index) for t in tensors])
    packed = np.concatenate([t.packed[index] for t in tensors])
    norms = np.concatenate([t.norms[index] for t in tensors]).astype(np.float32)
    count = packed.shape[0]
    values = lut[packed].reshape(count, -1, first.group)
    values *= norms[:, :, None]
    if first.group == pinned.GROUP:
        groups = pinned.dequant_rows(values, _H128)
    else:
        groups = values @ hadamard_matrix(first.group)
    return groups.reshape(len(tensors), len(index), -1)[:, :, : first.cols]
