"""Pinned norms for the int8 numerics: RMSNorm and LayerNorm in a fixed float64 order.

A row's sums run through a halving tree: the row (as float64) zero-padded to the next power of
two P, then `v[i] = v[i] + v[i + P/2]` for P/2, P/4, ..., 1 (`tree_sum`). The order depends
only on the row length, never on the number of rows or the machine, and numpy can run it
vectorised across rows in log2(P) steps. Then, per row, in float64:

* RMSNorm:   `inv = 1 / sqrt(tree(x*x) / d + eps)`, `y = f32((x * inv) * w)`
* LayerNorm: `m = tree(x) / d`, `c = x - m`, `inv = 1 / sqrt(tree(c*c) / d + eps)`,
  `y = f32(((c * inv) * w) + b)`

`norm` runs the native kernel (`native/np_i8.h`) when it is built, else `norm_reference`;
both give the same bits (tests/kernels/test_i8.py).
"""

from __future__ import annotations

import numpy as np

from . import native

F32, F64 = np.float32, np.float64


def tree_sum(v: np.ndarray) -> np.ndarray:
    """The halving-tree sum over the last axis of float64 v [T, d] -> [T]."""
    rows, d = v.shape
    p = 1
    while p < d:
        p *= 2
    buf = np.zeros((rows, p), F64)
    buf[:, :d] = v
    while p > 1:
        p //= 2
        buf = buf[:, :p] + buf[:, p : 2 * p]
    return buf[:, 0]


def norm_reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float,
                   center: bool) -> np.ndarray:
    """LayerNorm (`center`) or RMSNorm of each row of x [..., d] (module doc)."""
    shape = np.shape(x)
    x64 = np.asarray(x, F32).reshape(-1, shape[-1]).astype(F64)
    d = x64.shape[1]
    if center:
        mean = tree_sum(x64) / F64(d)
        c = x64 - mean[:, None]
    else:
        c = x64
    var = tree_sum(c * c) / F64(d)
    inv = F64(1.0) / np.sqrt(var + F64(eps))
    y = c * inv[:, None]
    y = y * weight.astype(F64)
    if bias is not None:
        y = y + bias.astype(F64)
    return y.astype(F32).reshape(shape)


def norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float,
         center: bool, use_native: bool | None = None) -> np.ndarray:
    """`norm_reference` of x [..., d], by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, norm_reference, _norm_native, x, weight, bias, eps,
                           center)


def _norm_native(lib, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float,
                 center: bool) -> np.ndarray:
    shape = x.shape
    x = np.ascontiguousarray(x, F32).reshape(-1, shape[-1])
    out = np.empty_like(x)
    status = lib.i8_norm(x.ctypes.data, x.shape[0], x.shape[1], weight.ctypes.data,
                         0 if bias is None else bias.ctypes.data, float(eps), int(center),
                         out.ctypes.data)
    if status:
        raise MemoryError(f"i8_norm failed ({status})")
    return out.reshape(shape)
