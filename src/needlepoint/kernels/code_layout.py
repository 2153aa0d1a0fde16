"""The storage layouts of CQ codes (the weight records' `layout`, `storage_layout`): what a load
builds beside the archive's packed codes for the exact kernels (kernels/exact.py), each a copy
of the same bytes regrouped by 16 weight rows, with a native builder and a numpy reference
that give the same bytes."""

from __future__ import annotations

import numpy as np

from . import native

# The storage layouts of the packed codes (`storage_layout`, the weight records' `layout`):
# the archive's LSB-first rows alone, or with a copy regrouped by 16-row blocks built at load:
# for 2-bit codes the lookup kernel's interleaved nibble planes, for 4-bit codes 4-byte columns
# of 16 rows (np_cq_int4.h, the AVX-512 VNNI kernel's one-lane-per-row form).
PACKED = "packed"
INTERLEAVED = "packed + row-interleaved nibble planes (interleave_codes)"
BLOCKED = "packed + 16-row blocks of 4-byte columns (block_codes)"
LUT_ROWS = 16  # weight rows per interleaved block (np_cq_lut.h)
REV4 = np.array([0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15])
# a 2-bit code byte (codes c_s in bits 2s..2s+1) as its plane nibbles b0 | b1 << 4, bit s of
# b0 / b1 the low / high bit of c_s
_BYTE = np.arange(256)
PLANE_NIBBLES = sum(((_BYTE >> 2 * s & 1) << s) | ((_BYTE >> 2 * s + 1 & 1) << (s + 4))
                    for s in range(4)).astype(np.uint8)


def storage_layout(storage_bits: int) -> str:
    """The layout a storage width is loaded in: 2-bit codes get the interleaved copy, 4-bit
    codes the blocked one."""
    return {2: INTERLEAVED, 4: BLOCKED}.get(storage_bits, PACKED)


def layout_codes(packed: np.ndarray, storage_bits: int, use_native: bool | None = None
                 ) -> np.ndarray | None:
    """The copy `storage_layout(storage_bits)` builds beside the packed codes, or None."""
    layout = storage_layout(storage_bits)
    if layout == INTERLEAVED:
        return interleave_codes(packed, use_native)
    if layout == BLOCKED:
        return block_codes(packed, use_native)
    return None


def block_codes(packed: np.ndarray, use_native: bool | None = None) -> np.ndarray:
    """`block_codes_reference`, by the native builder when it is built (same bytes)."""
    return native.dispatch(use_native, block_codes_reference, _block_native, packed)


def _block_native(lib, packed: np.ndarray) -> np.ndarray:
    return _native_copy(lib.np_cq_block4, packed)


def _native_copy(builder, packed: np.ndarray) -> np.ndarray:
    """A native builder's copy of codes [rows, row_bytes] (rows any stride apart) as uint8
    [blocks of 16 rows, 16 * row_bytes]."""
    rows, row_bytes = packed.shape
    if packed.strides[1] != 1:
        packed = np.ascontiguousarray(packed)
    out = np.empty((-(-rows // LUT_ROWS), LUT_ROWS * row_bytes), np.uint8)
    builder(packed.ctypes.data, rows, row_bytes, packed.strides[0], out.ctypes.data)
    return out


def block_codes_reference(packed: np.ndarray) -> np.ndarray:
    """The blocked copy of 4-bit codes [rows, row_bytes] (np_cq_int4.h np_b4_group): rows
    padded with zero bytes to blocks of 16, each block and 64-byte group 16 registers of 64
    bytes, register k holding bytes 4k .. 4k + 3 of rows 0..15 in turn. uint8
    [blocks, 16 * row_bytes]: the same bytes regrouped."""
    rows, row_bytes = packed.shape
    blocks, groups = -(-rows // LUT_ROWS), row_bytes // 64
    padded = np.zeros((blocks * LUT_ROWS, row_bytes), np.uint8)
    padded[:rows] = packed
    cube = padded.reshape(blocks, LUT_ROWS, groups, 16, 4)  # [b, row, g, k, byte]
    return np.ascontiguousarray(cube.transpose(0, 2, 3, 1, 4)).reshape(blocks, -1)


def interleave_codes(packed: np.ndarray, use_native: bool | None = None) -> np.ndarray:
    """`interleave_codes_reference`, by the native builder when it is built (same bytes)."""
    return native.dispatch(use_native, interleave_codes_reference, _interleave_native, packed)


def _interleave_native(lib, packed: np.ndarray) -> np.ndarray:
    return _native_copy(lib.np_cq_interleave, packed)


def interleave_codes_reference(packed: np.ndarray) -> np.ndarray:
    """The row-interleaved copy of 2-bit codes [rows, row_bytes] (np_cq_lut.h np_lut_split):
    rows padded with code 0 to blocks of 16, each block and 128-group 16 registers of 32 bytes,
    register o holding byte rev4(o) (lane 0) and 16 + rev4(o) (lane 1) of the group's codes of
    rows 0..15, each byte as PLANE_NIBBLES. uint8 [blocks, 16 * row_bytes]: the same bytes."""
    rows, row_bytes = packed.shape
    blocks, groups = -(-rows // LUT_ROWS), row_bytes // 32
    padded = np.zeros((blocks * LUT_ROWS, row_bytes), np.uint8)
    padded[:rows] = PLANE_NIBBLES[packed]
    cube = padded.reshape(blocks, LUT_ROWS, groups, 2, 16)[..., REV4]  # [b, row, g, lane, o]
    return np.ascontiguousarray(cube.transpose(0, 2, 4, 3, 1)).reshape(blocks, -1)
