"""Row kernels of the int8 numerics: the pinned exp and the A8 row codes (the one wrapper of
each, `kernels.pinned.exp32` and `kernels.exact.a8_codes`, re-exported here) and causal int8
attention (`native/np_i8_rows.h`, the one attention row of `np_attend.h`), whose definition
is `kernels.pinned.attend_reference` over a causal cache (same bits:
tests/kernels/test_i8_block.py).
"""

from __future__ import annotations

import numpy as np

from . import native, pinned
from .exact import a8_codes
from .pinned import exp32

F32 = np.float32

__all__ = ["a8_codes", "attend_causal", "attend_causal_reference", "causal_slots", "exp32"]


def causal_slots(start: int, count: int, heads: int, kv_heads: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """slots [count*heads, start+count] and keys seen per query row (t, h): the cache rows
    `p * kv_heads + g` of positions p = 0 .. start + t of kv head g = h // (heads / kv_heads)."""
    g = np.arange(heads, dtype=np.int64) // (heads // kv_heads)
    total = start + count
    slots = np.arange(total, dtype=np.int64)[None, None, :] * kv_heads + g[None, :, None]
    slots = np.ascontiguousarray(np.broadcast_to(slots, (count, heads, total)))
    seen = np.repeat(np.arange(start + 1, total + 1, dtype=np.int64), heads)
    return slots.reshape(count * heads, total), seen


def attend_causal_reference(qcode: np.ndarray, qscale: np.ndarray, start: int, heads: int,
                            kcode: np.ndarray, kscale: np.ndarray, vcode: np.ndarray,
                            vscale: np.ndarray) -> np.ndarray:
    """`pinned.attend_reference` of query rows (t, h) = qcode [T*heads, hd] (int16 A16
    codes) at positions start.. over a cache of int16 keys kcode and int8 values vcode
    [capacity, kv_heads, hd] (scales [capacity, kv_heads]), causally -> [T, heads*hd]
    float32."""
    rows, hd = qcode.shape
    count = rows // heads
    kv_heads = kcode.shape[1]
    flat = kcode.shape[0] * kv_heads
    slots, seen = causal_slots(start, count, heads, kv_heads)
    out = pinned.attend_reference(qcode, qscale, kcode.reshape(flat, hd), kscale.reshape(flat),
                                  vcode.reshape(flat, hd), vscale.reshape(flat), slots, seen)
    return out.reshape(count, heads * hd)


def attend_causal(qcode: np.ndarray, qscale: np.ndarray, start: int, heads: int,
                  kcode: np.ndarray, kscale: np.ndarray, vcode: np.ndarray,
                  vscale: np.ndarray, use_native: bool | None = None) -> np.ndarray:
    """`attend_causal_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, attend_causal_reference, _attend_causal_native, qcode,
                           qscale, start, heads, kcode, kscale, vcode, vscale)


def _attend_causal_native(lib, qcode: np.ndarray, qscale: np.ndarray, start: int, heads: int,
                          kcode: np.ndarray, kscale: np.ndarray, vcode: np.ndarray,
                          vscale: np.ndarray) -> np.ndarray:
    rows, hd = qcode.shape
    count = rows // heads
    kv_heads = kcode.shape[1]
    if kcode.dtype != np.int16 or qcode.dtype != np.int16:
        raise TypeError("the transformer int8 attention takes int16 keys and queries")
    qcode = np.ascontiguousarray(qcode, np.int16)
    qscale = np.ascontiguousarray(qscale, F32)
    out = np.empty((count, heads * hd), F32)
    work = np.empty(start + count, F32)
    lib.i8_attend_causal(qcode.ctypes.data, qscale.ctypes.data, count, start, heads, kv_heads,
                         hd, kcode.ctypes.data, kscale.ctypes.data, vcode.ctypes.data,
                         vscale.ctypes.data, out.ctypes.data, work.ctypes.data)
    return out
