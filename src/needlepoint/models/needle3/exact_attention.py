"""Deploy attention: an int8 K/V cache and the pinned int8 attention kernel (fixture README
"Deploy quantization" (2)-(3); docs/numerics.md "Attention").

Keys (after k_norm and RoPE) and values (after their taps) are A8-quantised per head row and
stored as int8 codes plus one float32 scale: exactly upstream's int8 KV. A query row attends
its visible keys in position order through `kernels.pinned.attend` (exact int32 q.k, scales in
a float64 epilogue, pinned exp, float32 sums in position order), so a row's result is the same
whether it is computed in a prefill chunk of any size or in a decode step.

The cache keeps `window` slots as a ring (position p in slot p % window) for bounded layers,
or `max_len` linear slots; stores are lazily mapped (a page is resident once written).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ...kernels import exact, native, pinned
from .cache import CacheShape, lazy_zeros

F32 = np.float32
TILE = 16  # key slots per vector of the 16-key copy (np_v3_cache.ktile)



# Positions a deploy session can rewind (`V3Session.rewind`): rings keep this many slots more
# than their window, so no key a rewound query needs has been overwritten.
MAX_REWIND = 64


class Int8LayerCache:
    """K/V of one layer for one sequence as int8 codes [KV, capacity, dim] + scales, and the
    raw q|k|v rows of its recent positions (the causal conv taps' tail)."""

    def __init__(self, shape: CacheShape) -> None:
        window, kv_heads, qk_dim, v_dim, conv_rows, conv_width, max_len = shape
        self.window = window
        self.max_len = max_len
        capacity = min(window + MAX_REWIND, max_len) if window else max_len
        self.kcode = lazy_zeros((kv_heads, capacity, qk_dim), np.int8)
        self.kscale = lazy_zeros((kv_heads, capacity), F32)
        self.vcode = lazy_zeros((kv_heads, capacity, v_dim), np.int8)
        self.vscale = lazy_zeros((kv_heads, capacity), F32)
        # the keys again, sixteen slots to a vector, and their code sums (np_att_rows scores
        # 16 keys per vpdpbusd from them); kept in step with kcode by every store
        tiles = -(-capacity // TILE) if qk_dim % 4 == 0 else 0
        self.ktile = lazy_zeros((kv_heads, tiles, qk_dim // 4, TILE, 4), np.int8)
        self.ksum = lazy_zeros((kv_heads, tiles * TILE), np.int32)
        # [position, filled]: positions recorded (the next chunk's first position) and slots
        # written; numpy memory, so the native step (np_v3_block.h) advances them in place
        self.meta = np.zeros(2, np.int64)
        self.lag = conv_rows
        # raw q|k|v of position p in row p % len: the last `lag` before the next chunk are the
        # conv tail; MAX_REWIND more let a rewind find the tail of an earlier position
        self.raw = np.zeros((conv_rows + MAX_REWIND if conv_rows else 0, conv_width), F32)
        self._c_struct: native.V3Cache | None = None  # this cache as the C struct (c_address)

    @property
    def position(self) -> int:
        return int(self.meta[0])

    @position.setter
    def position(self, value: int) -> None:
        self.meta[0] = value

    @property
    def filled(self) -> int:
        return int(self.meta[1])

    @filled.setter
    def filled(self, value: int) -> None:
        self.meta[1] = value

    @property
    def c_address(self) -> int:
        """Address of this cache as the native step's `np_v3_cache` (built on first use)."""
        struct = self._c_struct
        if struct is None:
            tiled = self.ktile.size > 0
            struct = native.V3Cache(
                self.kcode.ctypes.data, self.kscale.ctypes.data, self.vcode.ctypes.data,
                self.vscale.ctypes.data, self.raw.ctypes.data, self.meta.ctypes.data,
                self.capacity, self.window, len(self.raw),
                self.ktile.ctypes.data if tiled else None, self.ksum.ctypes.data if tiled else None,
            )
            self._c_struct = struct
        return ctypes.addressof(struct)

    @property
    def capacity(self) -> int:
        return self.kcode.shape[1]

    @property
    def conv_tail(self) -> np.ndarray:
        """Raw rows of positions position-lag .. position-1, oldest first (zeros before 0)."""
        wanted = np.arange(self.position - self.lag, self.position)
        tail = self.raw[wanted % max(1, len(self.raw))] if self.lag else self.raw[:0]
        tail[wanted < 0] = 0.0
        return tail

    @conv_tail.setter
    def conv_tail(self, value: np.ndarray) -> None:
        """`attention._conv` hands back the new tail; the ring already holds it (record_raw)."""

    def record_raw(self, start: int, raw: np.ndarray) -> None:
        """Raw q|k|v rows [C, width] of positions start .. start+C-1."""
        if self.lag:
            keep = min(len(raw), len(self.raw))
            positions = np.arange(start + len(raw) - keep, start + len(raw))
            self.raw[positions % len(self.raw)] = raw[len(raw) - keep :]
        self.position = start + len(raw)

    def rewind_to(self, position: int) -> None:
        """Forget positions >= position (their slots are rewritten before anything reads them)."""
        self.position = position

    def copy(self) -> Int8LayerCache:
        other = Int8LayerCache.__new__(Int8LayerCache)
        other.window, other.max_len, other.meta = self.window, self.max_len, self.meta.copy()
        for name in ("kcode", "kscale", "vcode", "vscale", "ksum"):
            source = getattr(self, name)
            fresh = lazy_zeros(source.shape, source.dtype)
            fresh[:, : self.filled] = source[:, : self.filled]
            setattr(other, name, fresh)
        other.ktile = lazy_zeros(self.ktile.shape, np.int8)
        tiles = -(-self.filled // TILE)
        other.ktile[:, :tiles] = self.ktile[:, :tiles]
        other.lag, other.raw = self.lag, self.raw.copy()
        other._c_struct = None
        return other

    def slot(self, positions: np.ndarray) -> np.ndarray:
        return positions % self.capacity if self.window else positions

    def write(self, start: int, codes: tuple[np.ndarray, ...]) -> None:
        """Store `quantize_kv` codes of positions start .. start+C-1 (the last `capacity` of
        them when a chunk is longer than a ring)."""
        kcode, kscale, vcode, vscale = codes  # [C, KV, qk], [C, KV], [C, KV, v], [C, KV]
        count = kcode.shape[0]
        keep = min(count, self.capacity)
        slots = self.slot(np.arange(start + count - keep, start + count))
        self.kcode[:, slots] = kcode[count - keep :].transpose(1, 0, 2)
        self.kscale[:, slots] = kscale[count - keep :].T
        self.vcode[:, slots] = vcode[count - keep :].transpose(1, 0, 2)
        self.vscale[:, slots] = vscale[count - keep :].T
        if self.ktile.size:  # the 16-key copy: slot s at tile s // 16, lane s % 16
            kept = kcode[count - keep :]
            self.ktile[:, slots // TILE, :, slots % TILE, :] = kept.reshape(
                keep, kept.shape[1], -1, 4)
            self.ksum[:, slots] = kept.astype(np.int32).sum(axis=2).T
        self.filled = min(self.capacity, max(self.filled, start + count))


def quantize_kv(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, ...]:
    """A8 codes (int8) and scales of keys [C, KV, qk] and values [C, KV, v], per head row."""
    count, kv_heads, _ = keys.shape
    kcode, kscale = exact.a8_codes(keys.reshape(count * kv_heads, -1))
    vcode, vscale = exact.a8_codes(values.reshape(count * kv_heads, -1))
    return (
        kcode.reshape(count, kv_heads, -1), kscale.reshape(count, kv_heads),
        vcode.reshape(count, kv_heads, -1), vscale.reshape(count, kv_heads),
    )


def attend_chunk(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, cache: Int8LayerCache, start: int
) -> np.ndarray:
    """Attention of the chunk's queries q [C, H, qk] (positions start..) over everything they
    see, the chunk's own keys [C, KV, qk] / values [C, KV, v] included, which are then stored;
    -> [C, H, v] float32. Query at position p sees positions j <= p with p - j < window
    (window 0: all of them)."""
    count = q.shape[0]
    codes = quantize_kv(keys, values)
    window = cache.window
    if not window or count == 1:
        # a linear store, or one position: storing first overwrites nothing a query needs
        cache.write(start, codes)
        store = (cache.kcode, cache.kscale, cache.vcode, cache.vscale)
        return _attend_rows(q, store, start, window, cache.slot)
    # a chunk over a ring: attend an unrolled context (old positions, then the chunk's)
    first = max(0, start - window + 1)
    old = cache.slot(np.arange(first, start))
    kcode, kscale, vcode, vscale = codes
    store = (
        np.concatenate([cache.kcode[:, old], kcode.transpose(1, 0, 2)], axis=1),
        np.concatenate([cache.kscale[:, old], kscale.T], axis=1),
        np.concatenate([cache.vcode[:, old], vcode.transpose(1, 0, 2)], axis=1),
        np.concatenate([cache.vscale[:, old], vscale.T], axis=1),
    )
    out = _attend_rows(q, store, start, window, lambda positions: positions - first)
    cache.write(start, codes)
    return out


def _attend_rows(q: np.ndarray, store: tuple, start: int, window: int, slot_of) -> np.ndarray:
    kcode, kscale, vcode, vscale = store
    count, heads, qk = q.shape
    kv_heads, vd = kcode.shape[0], vcode.shape[2]
    group = heads // kv_heads
    positions = np.arange(start, start + count)
    lo = np.maximum(0, positions - window + 1) if window else np.zeros(count, np.int64)
    counts = positions - lo + 1
    offsets = np.arange(int(counts.max()))
    visible = np.minimum(lo[:, None] + offsets[None, :], positions[:, None])  # oldest first
    slots = slot_of(visible)
    qcode, qscale = exact.a8_codes(q.reshape(count * heads, qk))
    qcode = qcode.reshape(count, kv_heads, group, qk)
    qscale = qscale.reshape(count, kv_heads, group)
    out = np.empty((count, kv_heads, group, vd), F32)
    row_slots = np.repeat(slots, group, axis=0)  # [count * group, longest]
    row_counts = np.repeat(counts, group)
    for head in range(kv_heads):
        out[:, head] = pinned.attend(
            qcode[:, head].reshape(count * group, qk), qscale[:, head].reshape(-1),
            np.ascontiguousarray(kcode[head]), np.ascontiguousarray(kscale[head]),
            np.ascontiguousarray(vcode[head]), np.ascontiguousarray(vscale[head]),
            row_slots, row_counts,
        ).reshape(count, group, vd)
    return out.reshape(count, heads, vd)
