"""Block-scaled int8 products ("verified int8 units"): quantise, exact integer dot, pinned
epilogue. The numpy reference of every function here gives the same bits as the native kernel
(`native/np_i8.h`, in the one native library `kernels.native`); tests/kernels/test_i8.py checks it.

Blocks run along the reduction (input) axis, `BLOCK = 32` values each: the block of ggml's
Q8_0 / Q4_0 / Q4_1 / Q5_x, so a GGUF weight enters as it is stored (no re-quantisation).

* An activation row x [K] (zero-padded to `k_pad`, a multiple of 32) becomes, per block b,
  `xs_b = max|x_b| / 127` (a float32 division; 1 for an all-zero block), codes
  `q = clip(rint(x / xs_b), -127, 127)` (int8) and their integer sum `S_b`.
* A weight is integer codes `c[n, k]` (int8 in [-127, 127], or 4-bit 0..15) with one float32
  scale `ws[n, b]` per output and block and, optionally, an offset `wm[n, b]`: the weight is
  `ws * c + wm` (Q4_1's `d * q + m`; Q4_0 is `d * q - 8 d`; plain int8 has no offset). Scales
  and offsets that are all exactly float16 (GGUF's own `d`, `m`) are stored as float16: fewer
  bytes per product, the same values, so the same bits.
* The block dot `D[t, n, b] = sum_k q[t, k] c[n, k]` is an exact integer (|D| < 2^20), in any
  order: numpy's float32 BLAS here (every partial sum is an integer below 2^24), AVX2 byte
  products in the kernel, any batch, thread or SIMD width.
* Epilogue, pinned, per output, in float64 over blocks b = 0, 1, ... in order:
  `inner = ws * D` (exact), `inner = inner + wm * S` (one rounding; offset weights only),
  `term = inner * xs`, `acc = acc + term`; then `y = float32(acc)`, `y = y + bias` (float32).

So a row's result never depends on which other rows are in the batch, on the chunking or on
the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import NonFiniteActivationError
from . import native

BLOCK = 32
LANES = 8  # outputs per packed group (one AVX2 vector of int32 sums)
LEVEL = np.float32(127.0)
F32, F64 = np.float32, np.float64
_REFERENCE_COLUMNS = 4096  # output columns per step of the numpy reference (bounds memory)


def padded(k: int) -> int:
    return -(-k // BLOCK) * BLOCK


# -- activations -----------------------------------------------------------------------------
def quantize_reference(x: np.ndarray, k_pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8 [T, k_pad], scale float32 [T, nb], sums int32 [T, nb]) of x [T, K]."""
    x = np.asarray(x, F32)
    rows, cols = x.shape
    if not np.all(np.isfinite(x)):
        raise NonFiniteActivationError("non-finite activation entering an int8 product")
    full = np.zeros((rows, k_pad), F32)
    full[:, :cols] = x
    blocks = full.reshape(rows, k_pad // BLOCK, BLOCK)
    peak = np.max(np.abs(blocks), axis=-1)
    scale = np.where(peak > 0, peak / LEVEL, F32(1.0)).astype(F32)
    codes = np.clip(np.rint(blocks / scale[..., None]), -127, 127).astype(np.int8)
    sums = codes.astype(np.int32).sum(axis=-1, dtype=np.int32)
    return codes.reshape(rows, k_pad), scale, sums


def quantize(x: np.ndarray, k_pad: int, use_native: bool | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`quantize_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, quantize_reference, _quantize_native, x, k_pad)


def _quantize_native(lib, x: np.ndarray, k_pad: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, F32)
    rows, cols = x.shape
    nb = k_pad // BLOCK
    codes = np.empty((rows, k_pad), np.int8)
    scale = np.empty((rows, nb), F32)
    sums = np.empty((rows, nb), np.int32)
    if lib.i8_quantize(x.ctypes.data, rows, cols, k_pad, codes.ctypes.data, scale.ctypes.data,
                       sums.ctypes.data):
        raise NonFiniteActivationError("non-finite activation entering an int8 product")
    return codes, scale, sums


# -- weights ---------------------------------------------------------------------------------
def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 codes [N, k_pad] and scales [N, nb] of a float weight w [N, K] (rows are
    outputs; blocks along K): `ws = max|w_b| / 127`, `c = clip(rint(w / ws), -127, 127)`."""
    codes, scale, _ = quantize_reference(w, padded(w.shape[1]))
    return codes, scale


@dataclass(eq=False)
class I8Weight:
    """A weight `[n_out, k]` in the kernel's layout: outputs in groups of 8 (zero-padded), per
    group and block the codes of 8 outputs x 32 inputs, interleaved so that one 32-byte vector
    holds 4 consecutive inputs of each of the 8 outputs. 8-bit: `data [G, nb, 8, 8, 4]`
    (group, block, input quad, output lane, input); 4-bit: `[G, nb, 4, 8, 4]` with quad p in
    the low nibble and quad p + 4 in the high one. `scale` / `offset` are `[G, nb, 8]`."""

    n_out: int
    k_in: int
    bits: int
    data: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None
    threads: int = 1

    @property
    def groups(self) -> int:
        return int(self.data.shape[0])

    @property
    def blocks(self) -> int:
        return int(self.data.shape[1])

    @property
    def k_pad(self) -> int:
        return self.blocks * BLOCK

    @property
    def nbytes(self) -> int:
        extra = 0 if self.offset is None else self.offset.nbytes
        return int(self.data.nbytes + self.scale.nbytes + extra)

    @property
    def half(self) -> bool:
        """Scales (and offsets) stored as float16."""
        return self.scale.dtype == np.float16

    def codes(self) -> np.ndarray:
        """The integer codes [G*8, k_pad] int8, row n = output n (padding rows are zero)."""
        if self.bits == 8:
            quads = self.data.view(np.int8)  # [G, nb, 8 quads, 8 lanes, 4]
        else:
            low = self.data & 0x0F
            quads = np.concatenate([low, self.data >> 4], axis=2).view(np.int8)
        g, nb = self.groups, self.blocks
        return quads.transpose(0, 3, 1, 2, 4).reshape(g * LANES, nb * BLOCK)

    def scales(self) -> tuple[np.ndarray, np.ndarray | None]:
        """scale [G*8, nb] and offset (or None), row n = output n."""
        g, nb = self.groups, self.blocks
        to_rows = lambda a: a.transpose(0, 2, 1).reshape(g * LANES, nb).astype(F32)  # noqa: E731
        return to_rows(self.scale), None if self.offset is None else to_rows(self.offset)


def _exactly_half(*arrays: np.ndarray | None) -> bool:
    for a in arrays:
        if a is None:
            continue
        with np.errstate(over="ignore"):
            back = a.astype(np.float16).astype(F32)
        if not np.array_equal(back, a):
            return False
    return True


def pack_weight(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray | None = None,
                n_out: int | None = None, k_in: int | None = None,
                threads: int = 1, half: bool | None = None) -> I8Weight:
    """The kernel layout of codes [N, k_pad] (int8 in [-127, 127], or 0..15 with an offset:
    stored 4-bit), scale / offset [N, nb] float32 (stored float16 where that is exact, unless
    `half` is False)."""
    codes = np.asarray(codes)
    rows, k_pad = codes.shape
    if k_pad % BLOCK or scale.shape != (rows, k_pad // BLOCK):
        raise ValueError(f"codes {codes.shape} / scale {scale.shape} are not blocks of {BLOCK}")
    low, high = int(codes.min(initial=0)), int(codes.max(initial=0))
    if low < -127 or high > 127:
        raise ValueError(f"weight codes must lie in [-127, 127], got {low}..{high}")
    bits = 4 if offset is not None and low >= 0 and high <= 15 else 8
    n_pad = -(-rows // LANES) * LANES
    nb = k_pad // BLOCK
    if rows == n_pad:
        full = codes.view(np.int8) if codes.dtype == np.uint8 else codes.astype(np.int8, copy=False)
    else:
        full = np.zeros((n_pad, k_pad), np.int8)
        full[:rows] = codes
    # [G, 8 lanes, nb, 8 quads, 4] -> [G, nb, quads, lanes, 4]
    quads = full.reshape(n_pad // LANES, LANES, nb, 8, 4).transpose(0, 2, 3, 1, 4)
    if bits == 8:
        data = np.ascontiguousarray(quads).view(np.uint8)
    else:
        u = quads.view(np.uint8)
        data = np.ascontiguousarray(u[:, :, :4] | (u[:, :, 4:] << 4))

    scale = np.asarray(scale, F32)
    offset = None if offset is None else np.asarray(offset, F32)
    store = np.float16 if half is not False and _exactly_half(scale, offset) else F32

    def grouped(a: np.ndarray) -> np.ndarray:
        out = np.zeros((n_pad, nb), store)
        out[:rows] = a
        return np.ascontiguousarray(out.reshape(n_pad // LANES, LANES, nb).transpose(0, 2, 1))

    return I8Weight(rows if n_out is None else n_out, k_pad if k_in is None else k_in, bits,
                    data, grouped(scale), None if offset is None else grouped(offset),
                    threads)


# -- the product -----------------------------------------------------------------------------
def output_rows(out: np.ndarray | None, rows: int, n_out: int) -> np.ndarray:
    """A product's output: `out` checked (float32 [rows, >= n_out], contiguous rows that may
    be strided: a column slice of a wider output), or a new float32 [rows, n_out]."""
    if out is None:
        return np.empty((rows, n_out), F32)
    if out.dtype != F32 or out.strides[1] != 4 or out.shape[0] != rows:
        raise ValueError("out must be float32 [T, n] with contiguous rows")
    return out


def matmul_reference(codes: np.ndarray, xscale: np.ndarray, xsums: np.ndarray, w: I8Weight,
                     bias: np.ndarray | None = None, out: np.ndarray | None = None
                     ) -> np.ndarray:
    """y [T, n_out] float32 of quantised rows (codes, scale, sums) times `w` (module doc),
    written to the first n_out columns of `out` when given."""
    rows = codes.shape[0]
    nb = w.blocks
    xb = codes.reshape(rows, nb, BLOCK).transpose(1, 0, 2).astype(F32)  # [nb, T, 32]
    wcodes = w.codes()
    wscale, woffset = w.scales()
    xs = xscale.astype(F64)
    ssum = xsums.astype(F64)
    out = output_rows(out, rows, w.n_out)
    for first in range(0, w.n_out, _REFERENCE_COLUMNS):
        last = min(w.n_out, first + _REFERENCE_COLUMNS)
        wb = wcodes[first:last].reshape(last - first, nb, BLOCK).transpose(1, 2, 0)
        dots = np.matmul(xb, wb.astype(F32))  # [nb, T, n]: exact integers (module doc)
        acc = np.zeros((rows, last - first), F64)
        for b in range(nb):
            inner = dots[b].astype(F64) * wscale[first:last, b].astype(F64)[None, :]
            if woffset is not None:
                inner = inner + woffset[first:last, b].astype(F64)[None, :] * ssum[:, b, None]
            term = inner * xs[:, b, None]
            acc = acc + term
        y = acc.astype(F32)
        if bias is not None:
            y = y + bias[first:last]
        out[:, first:last] = y
    return out


def matmul(codes: np.ndarray, xscale: np.ndarray, xsums: np.ndarray, w: I8Weight,
           bias: np.ndarray | None = None, out: np.ndarray | None = None,
           use_native: bool | None = None) -> np.ndarray:
    """`matmul_reference`, by the native kernel when it is built (same bits). `out`, if given,
    is a float32 [T, >= n_out] array whose first n_out columns receive the result (its rows
    may be strided: a column slice of a wider output). A part that is not an `I8Weight` (a
    `kernels.blockweight.BlockWeight`: a weight as its file stores it) runs its own product,
    `w.product`, with the same arguments."""
    if not isinstance(w, I8Weight):
        return w.product(codes, xscale, xsums, bias, out, use_native)
    return native.dispatch(use_native, matmul_reference, _matmul_native, codes, xscale, xsums,
                           w, bias, out)


def _matmul_native(lib, codes: np.ndarray, xscale: np.ndarray, xsums: np.ndarray,
                   w: I8Weight, bias: np.ndarray | None, out: np.ndarray | None) -> np.ndarray:
    rows = codes.shape[0]
    out = output_rows(out, rows, w.n_out)
    offset = 0 if w.offset is None else w.offset.ctypes.data
    status = lib.i8_matmul(
        codes.ctypes.data, xscale.ctypes.data, xsums.ctypes.data, rows, w.blocks, w.bits,
        w.data.ctypes.data, w.scale.ctypes.data, offset, int(w.half), w.groups, w.n_out,
        0 if bias is None else bias.ctypes.data, out.ctypes.data, out.strides[0] // 4,
        w.threads,
    )
    if status:
        raise MemoryError(f"i8_matmul failed ({status})")
    return out


def linear(x: np.ndarray, w: I8Weight, bias: np.ndarray | None = None,
           use_native: bool | None = None) -> np.ndarray:
    """`quantize` then `matmul`: the int8 product of float32 rows x [T, k_in] (`w` an
    `I8Weight`, or a `kernels.blockweight.BlockWeight`, which `matmul` hands its own
    product)."""
    codes, scale, sums = quantize(x, w.k_pad, use_native)
    return matmul(codes, scale, sums, w, bias, use_native=use_native)
