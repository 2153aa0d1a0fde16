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

from ..cact import CQTensor
from .fwht import fwht_groups, hadamard_matrix


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
    idx = unpack_indices(cq, rows)
    norms = (cq.norms if rows is None else cq.norms[rows]).astype(np.float32)
    values = cq.codebook[idx].reshape(idx.shape[0], -1, cq.group)
    values *= norms[:, :, None]
    return values.reshape(idx.shape[0], -1)


def dequantize_rows(cq: CQTensor, rows: np.ndarray | slice | None = None) -> np.ndarray:
    """Dequantised float32 rows [len(rows), cols] (a row gather: embedding, engram tables)."""
    values = rotated_weights(cq, rows)
    count = values.shape[0]
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
