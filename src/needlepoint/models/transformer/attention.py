"""Causal self-attention over a per-layer KV cache, with grouped-query heads.

Keys and values are cached after RoPE, `[kv_heads, positions, head_dim]`, in buffers that grow
by doubling (a model's `max_seq_len` can be far larger than any one conversation). A chunk of T
new queries at absolute positions `start..start+T-1` attends to cache positions `0..start+i`.
GQA: kv head g serves query heads `g*group .. (g+1)*group - 1`; the query heads of one group
are stacked into one product against their shared keys, so no kv head is ever repeated.
Scores are `q k^T * scale` (soft-capped where the spec says so), softmax over keys in float32.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
_MIN_CAPACITY = 64


class KeepsEveryPosition:
    """Rewinding a cache that keeps every position (float and int8 full caches alike):
    only `length` moves."""

    __slots__ = ()
    length: int

    def can_rewind_to(self, position: int) -> bool:
        return True  # every position is kept

    def rewind_to(self, position: int) -> None:
        """Forget positions >= `position` (exact: they are overwritten before being read)."""
        self.length = min(self.length, position)


class KVCache(KeepsEveryPosition):
    """Keys and values of one layer, `[kv_heads, length, head_dim]` each."""

    __slots__ = ("keys", "values", "length", "limit")

    def __init__(self, kv_heads: int, head_dim: int, limit: int) -> None:
        self.keys = np.zeros((kv_heads, 0, head_dim), F32)
        self.values = np.zeros((kv_heads, 0, head_dim), F32)
        self.length = 0
        self.limit = limit

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add k, v [T, kv_heads, hd]; returns views of every cached key and value."""
        count = k.shape[0]
        end = self.length + count
        if end > self.keys.shape[1]:
            capacity = min(self.limit, max(_MIN_CAPACITY, 2 * self.keys.shape[1], end))
            capacity = max(capacity, end)
            for name in ("keys", "values"):
                old = getattr(self, name)
                grown = np.empty((old.shape[0], capacity, old.shape[2]), F32)
                grown[:, : self.length] = old[:, : self.length]
                setattr(self, name, grown)
        self.keys[:, self.length : end] = k.transpose(1, 0, 2)
        self.values[:, self.length : end] = v.transpose(1, 0, 2)
        self.length = end
        return self.keys[:, :end], self.values[:, :end]

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int,
               scale: float, softcap: float | None = None) -> np.ndarray:
        """Append k, v [T, Hkv, hd]; q [T, H, hd] at positions start.. -> [T, H*hd]."""
        keys, values = self.append(k, v)
        return causal_attention(q, keys, values, start, scale, softcap=softcap)

    def copy(self) -> KVCache:
        other = KVCache.__new__(KVCache)
        other.keys = self.keys[:, : self.length].copy()
        other.values = self.values[:, : self.length].copy()
        other.length, other.limit = self.length, self.limit
        return other


def causal_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int,
                     scale: float, base: int = 0, window: int | None = None,
                     softcap: float | None = None) -> np.ndarray:
    """q [T, H, hd] at positions start.., keys/values [Hkv, N, hd] of positions base.. ->
    [T, H*hd]; with a `window`, query p sees keys p - window < j <= p (`window.py`); with
    `softcap`, scores are `softcap * tanh(scores / softcap)` before the mask and softmax."""
    count, heads, head_dim = q.shape
    kv_heads, total, _ = keys.shape
    group = heads // kv_heads
    # [T, H, hd] -> [Hkv, group*T, hd]: query head h = g*group + j sits in kv group g
    stacked = q.transpose(1, 0, 2).reshape(kv_heads, group * count, head_dim)
    scores = np.matmul(stacked, keys.transpose(0, 2, 1))  # [Hkv, group*T, N]
    scores *= F32(scale)
    if softcap is not None:
        scores = np.tanh(scores / F32(softcap)) * F32(softcap)
    scores = scores.reshape(kv_heads, group, count, total)
    if count > 1 or window is not None:  # a single new query sees every cached position
        rows = np.arange(start, start + count)[:, None]
        keys_at = base + np.arange(total)[None, :]
        hidden = keys_at > rows  # [T, N]
        if window is not None:
            hidden |= keys_at <= rows - window
        scores[..., hidden] = -np.inf
    scores -= np.max(scores, axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= np.sum(scores, axis=-1, keepdims=True, dtype=F32)
    out = np.matmul(scores.reshape(kv_heads, group * count, total), values)  # [Hkv, gT, hd]
    out = out.reshape(heads, count, head_dim).transpose(1, 0, 2)
    return out.reshape(count, heads * head_dim)
