"""Per-layer decode state: the K/V store and the q/k/v conv tail (fixture README step 5).

A layer whose attention is bounded to `window` positions keeps a ring of exactly `window`
slots (position p lives in slot `p % window`); an unbounded (global, full-causal) layer keeps a
linear store of `max_len` slots. Both are mapped lazily (`lazy_zeros`): a page becomes
resident when a position on it is first written, so a short sequence costs only what it
fills, and no store is ever regrown and copied (peak RSS). Keys are stored after k_norm and
RoPE, values after their taps; in deploy numerics both are stored already fake-quantised
(A8 per head row), i.e. the exact float32 values `codes * step` that upstream's int8 KV
attends with, so no dequantisation happens per step.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ...formats.needle3_geometry import V3Config

F32 = np.float32
# Stores smaller than this come from malloc (not worth a mapping of their own).
LAZY_BYTES = 1 << 16


def lazy_zeros(shape: tuple[int, ...], dtype=F32) -> np.ndarray:
    """An array of zeros in its own anonymous mapping: untouched pages stay unallocated
    (np.zeros from a reused heap block would write, so hold, every page), and the memory
    goes back to the system when the array is freed."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes < LAZY_BYTES:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)


def bounded_window(window: int, kv_window: int | None) -> int:
    """A layer's window (0 = unbounded) once every layer is limited to `kv_window`."""
    if not kv_window:
        return window
    return min(window, kv_window) if window else kv_window


class CacheShape(NamedTuple):
    """What every numerics' KV cache class is built from (`new_caches`): one layer's window
    (0 = unbounded), K/V heads, key and value widths, the conv tail's rows and width, and the
    longest sequence."""

    window: int
    kv_heads: int
    qk_dim: int
    v_dim: int
    conv_rows: int
    conv_width: int
    max_len: int


def new_caches(cfg: V3Config, cache_type: type, windows: Sequence[int],
               kv_window: int | None) -> list:
    """A fresh cache of `cache_type` (the numerics' KV cache class) per block of `windows`."""
    conv_rows = max(0, cfg.qkv_conv_taps - 1)
    conv_width = (cfg.num_heads + cfg.num_kv_heads) * cfg.qk_head_dim
    conv_width += cfg.num_kv_heads * cfg.v_head_dim
    return [
        cache_type(CacheShape(bounded_window(window, kv_window), cfg.num_kv_heads,
                              cfg.qk_head_dim, cfg.v_head_dim, conv_rows, conv_width,
                              cfg.max_seq_len))
        for window in windows
    ]


class LayerCache:
    """K/V of one layer for one sequence: keys [KV, capacity, qk], values [KV, capacity, v]."""

    def __init__(self, shape: CacheShape) -> None:
        window, kv_heads, qk_dim, v_dim, conv_rows, conv_width, max_len = shape
        self.window = window
        self.max_len = max_len
        capacity = window if window else max_len
        self.keys = lazy_zeros((kv_heads, capacity, qk_dim))
        self.values = lazy_zeros((kv_heads, capacity, v_dim))
        self.filled = 0  # slots written so far (all of them once a ring has wrapped)
        self.conv_tail = np.zeros((conv_rows, conv_width), F32)  # raw q|k|v, oldest first

    def copy(self) -> LayerCache:
        other = LayerCache.__new__(LayerCache)
        other.window, other.max_len, other.filled = self.window, self.max_len, self.filled
        other.keys = lazy_zeros(self.keys.shape)
        other.values = lazy_zeros(self.values.shape)
        other.keys[:, : self.filled] = self.keys[:, : self.filled]
        other.values[:, : self.filled] = self.values[:, : self.filled]
        other.conv_tail = self.conv_tail.copy()
        return other

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def context_start(self, start: int) -> int:
        """First position a query at `start` may see."""
        return max(0, start - self.window + 1) if self.window else 0

    def context(self, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Stored keys/values of positions [context_start(start), start), oldest first."""
        first = self.context_start(start)
        if not self.window:
            return self.keys[:, first:start], self.values[:, first:start]
        slots = np.arange(first, start) % self.capacity
        return self.keys[:, slots], self.values[:, slots]

    def write(self, start: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Store keys [C, KV, qk] and values [C, KV, v] of positions start .. start+C-1."""
        count = keys.shape[0]
        self.filled = min(self.capacity, max(self.filled, start + count))
        if not self.window:
            self.keys[:, start : start + count] = keys.transpose(1, 0, 2)
            self.values[:, start : start + count] = values.transpose(1, 0, 2)
            return
        keep = min(count, self.capacity)
        slots = np.arange(start + count - keep, start + count) % self.capacity
        self.keys[:, slots] = keys[count - keep :].transpose(1, 0, 2)
        self.values[:, slots] = values[count - keep :].transpose(1, 0, 2)

    def write_one(self, position: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Store one position's keys [KV, qk] and values [KV, v] (the decode step)."""
        self.filled = min(self.capacity, max(self.filled, position + 1))
        slot = position % self.capacity if self.window else position
        self.keys[:, slot] = keys
        self.values[:, slot] = values

    def conv_step(self, raw: np.ndarray, taps: np.ndarray) -> np.ndarray:
        """Causal depthwise taps of one position's raw q|k|v [width] (`attention.project_qkv`
        for a chunk of one): `taps[0] raw + taps[1] raw_-1 + ...`, summed in that order;
        advances the conv tail in place."""
        lag = self.conv_tail.shape[0]
        mixed = taps[0] * raw
        for back in range(1, lag + 1):
            mixed += taps[back] * self.conv_tail[lag - back]
        if lag:
            self.conv_tail[:-1] = self.conv_tail[1:]
            self.conv_tail[-1] = raw
        return mixed

    def visible(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """After writing `position`: every stored key/value its query sees (views, ring order;
        attention is order-free, so the ring is never unrolled on the decode path)."""
        used = min(position + 1, self.capacity) if self.window else position + 1
        return self.keys[:, :used], self.values[:, :used]
