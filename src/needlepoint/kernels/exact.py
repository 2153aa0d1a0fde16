"""Exact CQ x A8 products (docs/numerics.md "CQ x A8 products").

An A8 activation row is integers q in [-128, 127] and one float32 scale s (fixture README
"Deploy quantization"). A CQ group dequantises to `(codebook[idx] * norm) @ H / sqrt(128)` with
H the unnormalised Walsh-Hadamard matrix (README "CQ tensors"), and H is symmetric, so

    y_r = s / sqrt(128) * sum_g norm_{r,g} * D_{r,g},
    D_{r,g} = sum_c codebook[idx_{r,g,c}] * v_{g,c}

with v_g = H q_g an integer vector (|v| <= 128 * 128). Every product `codebook[k] * v_c` is a
multiple of the codebook's smallest quantum and every partial sum of a group stays below 2^53
of those quanta (`check_codebook`), so D is computed exactly in float64 whatever the order:
BLAS here, a byte-table sweep in the native kernel, any batch, chunk, thread or SIMD width.
The epilogue over the groups is one pinned sequence of float64 operations, rounded once to
float32. `cq_matmul` runs the native kernel when it is built, else `cq_matmul_reference`; both
give the same bits (tests/kernels/test_exact.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..errors import NonFiniteActivationError
from . import code_layout as _layout
from . import native
from .cq_tensor import CQTensor

GROUP = 128
INV_SQRT_GROUP = 0.08838834764831845  # 1 / sqrt(128), a float64
F32, F64 = np.float32, np.float64
LEVEL = F32(127.0)
# the storage layouts of the codes (kernels/code_layout.py), under their exact.* names
PACKED, INTERLEAVED, BLOCKED = _layout.PACKED, _layout.INTERLEAVED, _layout.BLOCKED
storage_layout, layout_codes = _layout.storage_layout, _layout.layout_codes
interleave_codes = _layout.interleave_codes
interleave_codes_reference = _layout.interleave_codes_reference
block_codes, block_codes_reference = _layout.block_codes, _layout.block_codes_reference


class ExactEngineError(ValueError):
    """A matrix the exact engine cannot take (not CQ, another group, a codebook whose sums
    would not be exact in float64); `numerics="float"` runs it."""


def check_codebook(codebook: np.ndarray) -> None:
    """Raise unless every group sum `sum_c codebook[idx_c] * v_c` (|v| <= 2^14, 128 terms) is
    exact in float64: all terms are multiples of the smallest level's ulp, and the largest
    possible sum must stay below 2^53 of those."""
    levels = np.abs(np.asarray(codebook, F32).astype(F64))
    nonzero = levels[levels > 0]
    if nonzero.size == 0:
        return
    quantum = float(np.min(np.spacing(nonzero.astype(F32)).astype(F64)))
    bound = GROUP * float(nonzero.max()) * float(GROUP * GROUP)
    if bound / quantum >= 2.0**53:
        raise ExactEngineError(
            f"codebook levels span too many binary orders for exact float64 sums "
            f"(max {nonzero.max():.3g}, quantum {quantum:.3g})"
        )


@dataclass(frozen=True)
class ExactPart:
    """Rows of one CQ tensor in a fused product: packed codes [rows, row_bytes] (a view of the
    archive), float32 norms [rows, groups], the first output column they write, and optionally
    the copy of their storage layout (`layout_codes`: for 2-bit codes `interleave_codes`, for
    4-bit codes `block_codes`; the same bytes regrouped)."""

    packed: np.ndarray
    norms: np.ndarray
    out_col: int
    interleaved: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return int(self.packed.shape[0])


@dataclass(frozen=True)
class ExactMatrix:
    """An `[out, cols]` product from CQ parts that read the same input: one storage width and
    codebook per matrix (`exact_matrices` splits fused parts that differ)."""

    cols: int
    in_pad: int
    out: int
    storage_bits: int
    codebook: np.ndarray  # float32
    parts: tuple[ExactPart, ...]
    threads: int = 1  # native kernel threads for large products (same bits for any count)

    @property
    def nbytes(self) -> int:
        """Bytes a one-row product reads: the norms and the codes (the copy of their layout,
        which the lookup and blocked 4-bit kernels read instead, where there is one)."""
        return sum(p.norms.nbytes + (p.packed if p.interleaved is None else p.interleaved).nbytes
                   for p in self.parts)

    def c_parts(self) -> ctypes.Array:
        """The parts as the C kernel's `np_cq_part` array (built once per matrix)."""
        cached = self.__dict__.get("_c_parts")
        if cached is None:
            cached = (native.CQPart * len(self.parts))(
                *[
                    native.CQPart(p.packed.ctypes.data, p.packed.strides[0], p.norms.ctypes.data,
                                  p.rows, p.out_col,
                                  None if p.interleaved is None else p.interleaved.ctypes.data)
                    for p in self.parts
                ]
            )
            object.__setattr__(self, "_c_parts", cached)
        return cached


def with_layout(matrix: ExactMatrix, interleave: bool = True) -> ExactMatrix:
    """`matrix` with (or without) the copy of its parts' storage layout (`layout_codes`; the
    same bits)."""
    parts = tuple(
        ExactPart(p.packed, p.norms, p.out_col,
                  layout_codes(p.packed, matrix.storage_bits) if interleave else None)
        for p in matrix.parts)
    return ExactMatrix(matrix.cols, matrix.in_pad, matrix.out, matrix.storage_bits,
                       matrix.codebook, parts, matrix.threads)


def exact_matrices(
    pieces: list[tuple[CQTensor, int, int]], threads: int = 1, interleave: bool = True
) -> list[ExactMatrix]:
    """The fused product of `pieces` (tensor, first row, end row), concatenated along the
    output: one ExactMatrix per run of pieces sharing storage width and codebook; `threads`
    for the native kernel (large products split their output rows). With `interleave`, parts
    get the copy of their `storage_layout` (`layout_codes`, built here, once per load)."""
    runs: list[tuple[tuple, CQTensor, list[ExactPart]]] = []
    column = 0
    for cq, row0, row1 in pieces:
        if cq.group != GROUP:
            raise ExactEngineError(f"{cq.name}: CQ group {cq.group}, the exact engine needs 128")
        if runs and cq.cols != runs[0][1].cols:
            raise ExactEngineError(f"{cq.name}: fused parts read different widths")
        check_codebook(cq.codebook)
        packed = np.asarray(cq.packed[row0:row1])
        part = ExactPart(packed, np.ascontiguousarray(cq.norms[row0:row1], dtype=F32), column,
                         layout_codes(packed, cq.storage_bits) if interleave else None)
        key = (cq.storage_bits, np.asarray(cq.codebook, F32).tobytes())
        if runs and runs[-1][0] == key:
            runs[-1][2].append(part)
        else:
            runs.append((key, cq, [part]))
        column += row1 - row0
    return [
        ExactMatrix(cq.cols, cq.in_pad, column, cq.storage_bits,
                    np.ascontiguousarray(cq.codebook, F32), tuple(parts), threads)
        for _, cq, parts in runs
    ]


# -- A8 and the integer rotation -------------------------------------------------------------
def a8_scale(x: np.ndarray) -> np.ndarray:
    """Per-row A8 scale [T] float32: `max|x| / 127` (a float32 division), 1 for an all-zero
    row. Raises NonFiniteActivationError on NaN or inf."""
    peak = np.max(np.abs(x), axis=-1)
    if not np.all(np.isfinite(peak)):
        raise NonFiniteActivationError("non-finite activation entering an A8 product")
    return np.where(peak > 0, peak / LEVEL, F32(1.0)).astype(F32)


def _row_codes_reference(x: np.ndarray, level: np.float32, dtype: type, what: str
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(codes [T, cols] of `dtype`, scale [T]): `s = max|x| / level` (a float32 division; 1
    for an all-zero row), `clip(rint(x / s), -level - 1, level)`."""
    x = np.asarray(x, F32)
    peak = np.max(np.abs(x), axis=-1)
    if not np.all(np.isfinite(peak)):
        raise NonFiniteActivationError(f"non-finite activation entering an {what}")
    scale = np.where(peak > 0, peak / level, F32(1.0)).astype(F32)
    codes = np.clip(np.rint(x / scale[:, None]), -float(level) - 1, float(level)).astype(dtype)
    return codes, scale


def _row_codes(entry, x: np.ndarray, dtype: type, what: str) -> tuple[np.ndarray, np.ndarray]:
    """`_row_codes_reference` by the native kernel `entry` (`np_a8_codes`, `np_a16_codes`)."""
    x = np.ascontiguousarray(x, F32)
    rows, cols = x.shape
    codes = np.empty((rows, cols), dtype)
    scale = np.empty(rows, F32)
    if entry(x.ctypes.data, rows, cols, codes.ctypes.data, scale.ctypes.data):
        raise NonFiniteActivationError(f"non-finite activation entering an {what}")
    return codes, scale


def a8_codes_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [T, cols], scale [T]): `clip(rint(x / s), -128, 127)` (README A8)."""
    return _row_codes_reference(x, LEVEL, np.int8, "A8 quantiser")


def _a8_codes_native(lib, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _row_codes(lib.np_a8_codes, x, np.int8, "A8 quantiser")


def a8_codes(x: np.ndarray, use_native: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`a8_codes_reference` of x [T, cols], by the native kernel when it is built."""
    return native.dispatch(use_native, a8_codes_reference, _a8_codes_native, x)


LEVEL16 = F32(32767.0)


def a16_codes_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes int16 [T, cols], scale [T]): A8's rule with 32767 levels: the transformer int8
    numerics' cached keys and queries (docs/numerics.md "int8 attention")."""
    return _row_codes_reference(x, LEVEL16, np.int16, "A16 quantiser")


def _a16_codes_native(lib, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _row_codes(lib.np_a16_codes, x, np.int16, "A16 quantiser")


def a16_codes(x: np.ndarray, use_native: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`a16_codes_reference` of x [T, cols], by the native kernel when it is built."""
    return native.dispatch(use_native, a16_codes_reference, _a16_codes_native, x)


def a8_rotate_reference(x: np.ndarray, in_pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(v int32 [T, in_pad], scale [T]): A8 codes zero-padded to `in_pad`, each 128-group
    rotated by the unnormalised Walsh-Hadamard transform (exact in int32)."""
    codes, scale = a8_codes_reference(x)
    rows, cols = codes.shape
    padded = np.zeros((rows, in_pad), np.int32)
    padded[:, :cols] = codes
    v = padded.reshape(rows, in_pad // GROUP, GROUP)
    half = 1
    while half < GROUP:
        view = v.reshape(rows, -1, GROUP // (2 * half), 2, half)
        a, b = view[..., 0, :].copy(), view[..., 1, :].copy()
        view[..., 0, :] = a + b
        view[..., 1, :] = a - b
        half *= 2
    return padded, scale


def a8_rotate(x: np.ndarray, in_pad: int, use_native: bool | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """`a8_rotate_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, a8_rotate_reference, _a8_rotate_native, x, in_pad)


def _a8_rotate_native(lib, x: np.ndarray, in_pad: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, F32)
    rows, cols = x.shape
    v = np.empty((rows, in_pad), np.int32)
    scale = np.empty(rows, F32)
    status = lib.np_a8_rotate(x.ctypes.data, rows, cols, cols, in_pad, v.ctypes.data,
                              scale.ctypes.data)
    if status == 1:
        raise NonFiniteActivationError("non-finite activation entering an A8 product")
    if status:
        raise ValueError(f"np_a8_rotate failed ({status})")
    return v, scale


# -- the products ----------------------------------------------------------------------------
def _levels(matrix: ExactMatrix, part: ExactPart) -> np.ndarray:
    """codebook[idx] of a part as float64 [rows, in_pad] (the reference's operand), from the
    LSB-first code stream of each row (README "CQ tensors")."""
    width = matrix.storage_bits
    bits = np.unpackbits(part.packed, axis=1, bitorder="little")[:, : matrix.in_pad * width]
    codes = bits.reshape(part.rows, matrix.in_pad, width).astype(np.int64)
    codes = (codes << np.arange(width, dtype=np.int64)).sum(axis=-1)
    return matrix.codebook.astype(F64)[codes]


def cq_matmul_reference(v: np.ndarray, scale: np.ndarray, matrix: ExactMatrix) -> np.ndarray:
    """y [T, out] float32 of the prepared activation (v, scale) times `matrix` (module doc)."""
    rows = v.shape[0]
    groups = matrix.in_pad // GROUP
    first = matrix.parts[0].out_col
    width = matrix.parts[-1].out_col + matrix.parts[-1].rows - first
    out = np.empty((rows, width), F32)
    vg = v.astype(F64).reshape(rows, groups, GROUP).transpose(1, 0, 2)  # [G, T, 128]
    s = scale.astype(F64)[:, None]
    for part in matrix.parts:
        levels = _levels(matrix, part).reshape(part.rows, groups, GROUP).transpose(1, 2, 0)
        dots = np.matmul(vg, levels)  # [G, T, rows]: exact (module doc), any BLAS order
        norms = part.norms.astype(F64)  # [rows, G]
        acc = np.zeros((rows, part.rows), F64)
        for g in range(groups):
            acc = acc + norms[None, :, g] * dots[g]
        y = acc * s
        y = y * INV_SQRT_GROUP
        out[:, _local(matrix, part)] = y.astype(F32)
    return out


def _local(matrix: ExactMatrix, part: ExactPart) -> slice:
    first = matrix.parts[0].out_col
    return slice(part.out_col - first, part.out_col - first + part.rows)


def cq_matmul(
    v: np.ndarray, scale: np.ndarray, matrix: ExactMatrix, use_native: bool | None = None
) -> np.ndarray:
    """`cq_matmul_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, cq_matmul_reference, _cq_matmul_native, v, scale, matrix)


def _cq_matmul_native(lib, v: np.ndarray, scale: np.ndarray, matrix: ExactMatrix) -> np.ndarray:
    rows = v.shape[0]
    first = matrix.parts[0].out_col
    width = matrix.parts[-1].out_col + matrix.parts[-1].rows - first
    out = np.empty((rows, width), F32)
    # the kernel writes column out_col + r: shift the pointer so the first part lands at 0
    base = out.ctypes.data - 4 * first
    status = lib.np_cq_matmul_threads(
        v.ctypes.data, scale.ctypes.data, rows, matrix.in_pad, matrix.storage_bits,
        matrix.codebook.ctypes.data, matrix.codebook.size, matrix.c_parts(), len(matrix.parts),
        base, width, 0, width, matrix.threads,
    )
    if status:
        raise MemoryError(f"np_cq_matmul failed ({status})")
    return out


def a8_product(x: np.ndarray, matrices: list[ExactMatrix], use_native: bool | None = None):
    """`A8(x) @ W^T` for the fused product `matrices` (one input, outputs side by side):
    [T, out] float32, exact (module doc)."""
    x = np.ascontiguousarray(x, F32)
    if x.ndim != 2:
        x = x.reshape(-1, x.shape[-1])
    v, scale = a8_rotate(x, matrices[0].in_pad, use_native)
    if len(matrices) == 1:
        return cq_matmul(v, scale, matrices[0], use_native)
    return np.concatenate([cq_matmul(v, scale, m, use_native) for m in matrices], axis=1)


