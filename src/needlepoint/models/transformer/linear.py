"""Every matrix product of the transformer goes through `Linear` (the one swap point).

`Linear(weight, bias)` holds a float32 weight in `[in, out]` orientation (a transposed view of
an `[out, in]` torch weight costs nothing, and keeps a memory-mapped tensor mapped) and applies
`y = x W (+ b)` over the last axis of `x`. `make_linear` is how `weights.py` builds every
projection, the LM head included. `Int8Linear` is the int8 numerics' product with the same
`__call__` (`kernels.i8`: weights as block-scaled integer codes, quantised once at load or taken
as GGUF stores them; activations quantised per row and block at each call; exact integer dots,
pinned float64 epilogue); `make_int8_linear` builds it from a float weight,
`Int8Linear([BlockWeight])` takes a weight as its file stores it, and `fuse` joins projections
that read the same input (q | k | v, gate | up) so the input is quantised once.
Fusing does not change any output's bits: each output column is computed on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...kernels import i8
from ...kernels.blockweight import BlockWeight

F32 = np.float32


class Linear:
    """`y = x @ weight (+ bias)`: weight [in, out] float32, bias [out] or None."""

    __slots__ = ("weight", "bias")

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
        self.weight = weight
        self.bias = bias

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = np.matmul(x, self.weight)
        if self.bias is not None:
            y += self.bias
        return y

    def __repr__(self) -> str:
        bias = ", bias" if self.bias is not None else ""
        return f"Linear({self.in_features} -> {self.out_features}{bias})"


def make_linear(weight: np.ndarray, bias: np.ndarray | None, *, in_out: bool) -> Linear:
    """A projection from a checkpoint weight stored `[in, out]` (`in_out`) or `[out, in]`."""
    w = np.asarray(weight, F32)
    return Linear(w if in_out else w.T, None if bias is None else np.asarray(bias, F32))


class Int8Linear:
    """`y = int8(x) W (+ bias)`: weight parts (`i8.I8Weight`, or `BlockWeight`: a weight as
    its file stores it; outputs side by side) reading one input of `in_features`; bias [out]
    float32 or None."""

    __slots__ = ("parts", "bias", "in_features", "out_features", "k_pad")

    def __init__(self, parts: Sequence[i8.I8Weight | BlockWeight], bias: np.ndarray | None) -> None:
        self.parts = tuple(parts)
        self.in_features = self.parts[0].k_in
        self.k_pad = self.parts[0].k_pad
        if any(p.k_in != self.in_features for p in self.parts):
            raise ValueError("fused int8 parts read different input widths")
        self.out_features = sum(p.n_out for p in self.parts)
        self.bias = None if bias is None else np.ascontiguousarray(bias, F32)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        lead = x.shape[:-1]
        codes, scale, sums = i8.quantize(x.reshape(-1, x.shape[-1]), self.k_pad)
        if len(self.parts) == 1:
            y = i8.matmul(codes, scale, sums, self.parts[0], self.bias)
        else:
            y = np.empty((codes.shape[0], self.out_features), F32)
            column = 0
            for part in self.parts:
                end = column + part.n_out
                bias = None if self.bias is None else self.bias[column:end]
                i8.matmul(codes, scale, sums, part, bias, out=y[:, column:end])
                column = end
        return y.reshape(*lead, self.out_features)

    def __repr__(self) -> str:
        kinds = "/".join(p.wtype.name if isinstance(p, BlockWeight) else f"{p.bits}-bit"
                         for p in self.parts)
        bias = ", bias" if self.bias is not None else ""
        return f"Int8Linear({self.in_features} -> {self.out_features}, {kinds}{bias})"


def make_int8_linear(weight: np.ndarray, bias: np.ndarray | None, *, in_out: bool,
                     threads: int = 1) -> Int8Linear:
    """An int8 projection from a float checkpoint weight (`[in, out]` if `in_out`, else
    `[out, in]`): symmetric int8 codes, one scale per output and block of 32 inputs."""
    w = np.asarray(weight, F32)
    w = w.T if in_out else w
    codes, scale = i8.quantize_weight(w)
    part = i8.pack_weight(codes, scale, n_out=w.shape[0], k_in=w.shape[1], threads=threads)
    return Int8Linear([part], bias)


def _root(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def joined(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """`np.concatenate([first, second])`, as a read-only view when `second`'s bytes follow
    `first`'s inside one array (parts of a mapped cache file, laid out end to end: no copy);
    else a copy."""
    root = _root(first)
    if (first.flags.c_contiguous and second.flags.c_contiguous and first.dtype == second.dtype
            and first.shape[1:] == second.shape[1:] and _root(second) is root
            and root.flags.c_contiguous
            and first.ctypes.data + first.nbytes == second.ctypes.data):
        shape = (first.shape[0] + second.shape[0], *first.shape[1:])
        view = np.ndarray(shape, first.dtype, buffer=root,
                          offset=first.ctypes.data - root.ctypes.data)
        view.flags.writeable = False
        return view
    return np.concatenate([first, second])


def _merge(parts: Sequence[i8.I8Weight | BlockWeight]) -> list[i8.I8Weight | BlockWeight]:
    """Adjacent packed parts of one storage kind whose outputs fill whole groups of 8 become
    one part (one kernel call; every output still its own sum). A BlockWeight stays a part
    of its own: its bytes are the file's, never copied into a joined array."""
    merged: list[i8.I8Weight | BlockWeight] = []
    for part in parts:
        last = merged[-1] if merged else None
        if (isinstance(last, i8.I8Weight) and isinstance(part, i8.I8Weight)
                and last.n_out % i8.LANES == 0 and last.bits == part.bits
                and (last.offset is None) == (part.offset is None)
                and last.blocks == part.blocks and last.half == part.half):
            offset = None if part.offset is None else joined(last.offset, part.offset)
            merged[-1] = i8.I8Weight(last.n_out + part.n_out, last.k_in, last.bits,
                                     joined(last.data, part.data),
                                     joined(last.scale, part.scale), offset,
                                     max(last.threads, part.threads))
        else:
            merged.append(part)
    return merged


def fuse(linears: Sequence[Int8Linear]) -> Int8Linear:
    """One product for several projections of the same input (outputs side by side)."""
    parts = _merge([p for lin in linears for p in lin.parts])
    if all(lin.bias is None for lin in linears):
        return Int8Linear(parts, None)
    bias = np.concatenate([np.zeros(lin.out_features, F32) if lin.bias is None else lin.bias
                           for lin in linears])
    return Int8Linear(parts, bias)
