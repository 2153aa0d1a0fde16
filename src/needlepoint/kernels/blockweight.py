"""Exact integer products over a GGUF weight's own blocks, as stored (no conversion at load).

`BlockWeight(wtype, data, n_out, k_in)` holds a weight `[n_out, k_in]` as the rows of its file
(`data` uint8 `[n_out, row_bytes]`, typically a zero-copy view of the memory-mapped file) and
its `kernels.wtypes.WeightType`. The product reads those bytes: each row's blocks are unpacked
to the generic form (`kernels/wtypes_unpack.py`): per block of 32 inputs int8 codes, int16
sub-scales s0, s1 (inputs 0-15, 16-31), float32 a and m, int16 min sub-scales u0, u1.

The activations are `kernels.i8.quantize`'s A8 rows (codes x, scale xs, per 32-block). Output
n of row t, over the blocks b = 0, 1, ... in order:

    P = s0 * dot(x[0:16], code[0:16]) + s1 * dot(x[16:32], code[16:32])   (exact int32)
    M = u0 * sum(x[0:16]) + u1 * sum(x[16:32])                              (exact int32)
    inner = f64(a) * f64(P) + f64(m) * f64(M)                               (float64)
    acc = acc + inner * f64(xs_b)                                           (float64)

then `y = float32(acc)`, `y = y + bias` (float32). For the types without an offset (m = 0,
u = 0) the `m * M` term adds +0 and the C kernels skip it: a zero's sign never reaches `acc`,
which starts at +0. Integer dots are exact in any order, so the numpy reference (float32 BLAS
on integers below 2^24) and the C kernels (`native/np_wt.h`, every SIMD variant, any thread
count) give the same bits (tests/kernels/test_wtypes*.py); a row's result never depends on the
batch. For Q8_0 this is `kernels.i8`'s epilogue exactly.
"""

from __future__ import annotations

import numpy as np

from ..errors import NonFiniteActivationError, UnsupportedTensorTypeError
from . import native
from .i8 import BLOCK, output_rows, padded
from .wtype_record import WeightType

F32, F64 = np.float32, np.float64
_REFERENCE_COLUMNS = 2048  # output rows unpacked per step of the numpy reference


class BlockWeight:
    """A weight `[n_out, k_in]` as stored: `data` uint8 `[n_out, row_bytes]`, never copied
    (a view of a mapped file stays mapped); `threads` splits a product over outputs."""

    __slots__ = ("wtype", "data", "_n_out", "_k_in", "threads")

    def __init__(self, wtype: WeightType, data: np.ndarray, n_out: int, k_in: int,
                 threads: int = 1) -> None:
        if wtype.unpack is None:
            raise UnsupportedTensorTypeError(
                f"{wtype.name} is a float type: convert it with wtypes.to_q8_0 for an "
                "integer product")
        data = np.asarray(data)
        k_pad = padded(k_in)
        row_values = k_pad if wtype.block_values == BLOCK else -(-k_in // 256) * 256
        if row_values != k_pad:
            raise UnsupportedTensorTypeError(
                f"{wtype.name} rows of {k_in} values are not whole blocks of "
                f"{wtype.block_values}")
        expect = (n_out, wtype.row_bytes(row_values))
        if data.dtype != np.uint8 or data.shape != expect:
            raise ValueError(f"{wtype.name} weight [{n_out}, {k_in}] needs uint8 rows "
                             f"{list(expect)}, got {data.dtype} {list(data.shape)}")
        if data.ndim == 2 and n_out and data.strides[1] != 1:
            data = np.ascontiguousarray(data)  # the kernels read each row's bytes in order
        self.wtype = wtype
        self.data = data
        self._n_out = int(n_out)
        self._k_in = int(k_in)
        self.threads = int(threads)

    @property
    def n_out(self) -> int:
        return self._n_out

    @property
    def k_in(self) -> int:
        return self._k_in

    @property
    def k_pad(self) -> int:
        return padded(self._k_in)

    @property
    def blocks(self) -> int:
        """Blocks of 32 inputs per row."""
        return self.k_pad // BLOCK

    @property
    def nbytes(self) -> int:
        return int(self.data.shape[0] * self.data.shape[1])

    @property
    def row_stride(self) -> int:
        """Bytes from one row's first byte to the next's."""
        return int(self.data.strides[0]) if self._n_out > 1 else int(self.data.shape[1])

    def rows(self, tokens) -> np.ndarray:
        """float32 [len(tokens), k_in]: the dequantised rows `tokens` (an embedding gather;
        only those rows are read)."""
        index = np.asarray(tokens, np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= self._n_out):
            raise IndexError(f"row index out of range [0, {self._n_out})")
        return self.wtype.dequantize(self.data[index])[:, : self._k_in]

    def dequantize(self) -> np.ndarray:
        """float32 [n_out, k_in], ggml's dequantisation of every row."""
        return self.wtype.dequantize(self.data)[:, : self._k_in]

    def select_rows(self, index) -> BlockWeight:
        """A new weight of rows `index` of this one, in that order (a copy)."""
        index = np.asarray(index, np.int64).reshape(-1)
        return BlockWeight(self.wtype, np.ascontiguousarray(self.data[index]), index.size,
                           self._k_in, self.threads)

    def product(self, codes: np.ndarray, xscale: np.ndarray, xsums: np.ndarray,
                bias: np.ndarray | None = None, out: np.ndarray | None = None,
                use_native: bool | None = None) -> np.ndarray:
        """`matmul(codes, xscale, xsums, self, ...)`: how `kernels.i8.matmul` runs a part
        that is not an `I8Weight`."""
        return matmul(codes, xscale, xsums, self, bias, out, use_native)

    def __repr__(self) -> str:
        return f"BlockWeight({self.wtype.name}, {self._n_out} x {self._k_in})"


def matmul_reference(codes: np.ndarray, xscale: np.ndarray, xsums: np.ndarray, w: BlockWeight,
                     bias: np.ndarray | None = None, out: np.ndarray | None = None
                     ) -> np.ndarray:
    """y [T, n_out] float32 of A8 rows (codes int8 [T, k_pad], xscale float32 [T, nb], xsums)
    times `w` (module doc), written to the first n_out columns of `out` when given. `xsums`
    is not needed: the half sums are taken from the codes."""
    del xsums  # the M term needs the sums of each half block, taken from the codes
    _check_activations(codes, xscale, w)
    rows, nb = codes.shape[0], w.blocks
    xb = codes.reshape(rows, nb, 2, 16)
    xhalf = xb.astype(np.int64).sum(axis=-1)  # [T, nb, 2]
    xf = xb.transpose(1, 2, 0, 3).astype(F32)  # [nb, 2, T, 16]
    xs = xscale.astype(F64)
    out = output_rows(out, rows, w.n_out)
    for first in range(0, w.n_out, _REFERENCE_COLUMNS):
        last = min(w.n_out, first + _REFERENCE_COLUMNS)
        form = w.wtype.unpack(w.data[first:last])
        wf = form.codes.reshape(last - first, nb, 2, 16).transpose(1, 2, 3, 0).astype(F32)
        dots = np.matmul(xf, wf).astype(np.int64)  # [nb, 2, T, n]: exact integers
        s = form.s.astype(np.int64).transpose(1, 2, 0)[:, :, None, :]  # [nb, 2, 1, n]
        u = form.u.astype(np.int64).transpose(1, 2, 0)[:, :, None, :]
        p = (s * dots).sum(axis=1)  # [nb, T, n]
        mm = (u * xhalf.transpose(1, 2, 0)[:, :, :, None]).sum(axis=1)
        a, m = form.a.astype(F64), form.m.astype(F64)  # [n, nb]
        acc = np.zeros((rows, last - first), F64)
        for b in range(nb):
            inner = a[:, b][None, :] * p[b].astype(F64) + m[:, b][None, :] * mm[b].astype(F64)
            term = inner * xs[:, b, None]
            acc = acc + term
        y = acc.astype(F32)
        if bias is not None:
            y = y + np.asarray(bias, F32)[first:last]
        out[:, first:last] = y
    return out


def _check_activations(codes: np.ndarray, xscale: np.ndarray, w: BlockWeight) -> None:
    if codes.shape[1] != w.k_pad or xscale.shape != (codes.shape[0], w.blocks):
        raise ValueError(f"activations {list(codes.shape)} do not match the weight's "
                         f"{w.k_pad} inputs")


def matmul(codes: np.ndarray, xscale: np.ndarray, xsums: np.ndarray, w: BlockWeight,
           bias: np.ndarray | None = None, out: np.ndarray | None = None,
           use_native: bool | None = None) -> np.ndarray:
    """`matmul_reference`, by the native kernel when it is built (same bits). `out`, if given,
    is float32 [T, >= n_out] whose first n_out columns receive the result (rows may be
    strided: a column slice of a wider output)."""
    return native.dispatch(use_native, matmul_reference, _matmul_native, codes, xscale, xsums,
                           w, bias, out)


def _matmul_native(lib, codes: np.ndarray, xscale: np.ndarray, xsums: np.ndarray,
                   w: BlockWeight, bias: np.ndarray | None, out: np.ndarray | None
                   ) -> np.ndarray:
    _check_activations(codes, xscale, w)
    rows = codes.shape[0]
    out = output_rows(out, rows, w.n_out)
    codes = np.ascontiguousarray(codes, np.int8)
    xscale = np.ascontiguousarray(xscale, F32)
    xsums = np.ascontiguousarray(xsums, np.int32)
    bias = None if bias is None else np.ascontiguousarray(bias, F32)
    status = lib.wt_matmul(
        codes.ctypes.data, xscale.ctypes.data, xsums.ctypes.data, rows, w.blocks,
        w.wtype.native_id, w.data.ctypes.data, w.row_stride, w.n_out,
        0 if bias is None else bias.ctypes.data, out.ctypes.data, out.strides[0] // 4,
        w.threads)
    if status == 1:
        raise NonFiniteActivationError("non-finite value in a block product")
    if status:
        raise MemoryError(f"wt_matmul failed ({status})")
    return out
