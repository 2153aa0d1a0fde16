"""Causal self-attention over a per-layer KV cache, with grouped-query heads.

Keys and values are cached after RoPE, `[kv_heads, positions, head_dim]` (`KVCache`; how its
buffers grow and what a sliding window keeps: `kv_cache.py`). A chunk of T
new queries at absolute positions `start..start+T-1` attends to cache positions `0..start+i`.
GQA: kv head g serves query heads `g*group .. (g+1)*group - 1`; the query heads of one group
are stacked into one product against their shared keys, so no kv head is ever repeated.
Scores are `q k^T * scale` (soft-capped where the spec says so), softmax over keys in float32.
"""

from __future__ import annotations

import numpy as np

from .kv_cache import KVRows

F32 = np.float32


class KVCache(KVRows):
    """Float32 keys and values of one layer, `[kv_heads, positions, head_dim]` each, kept as
    the layer's window says (`kv_cache.py`)."""

    NAMES = ("keys", "values")
    AXIS = 1
    __slots__ = ("keys", "values")

    def __init__(self, kv_heads: int, head_dim: int, limit: int,
                 window: int | None = None) -> None:
        empty = np.zeros((kv_heads, 0, head_dim), F32)
        self._setup({"keys": empty, "values": empty.copy()}, limit, window)

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int,
               scale: float, softcap: float | None = None) -> np.ndarray:
        """Append k, v [T, Hkv, hd]; q [T, H, hd] at positions start.. -> [T, H*hd]."""
        self.check_start(start)
        self.write({"keys": k.transpose(1, 0, 2), "values": v.transpose(1, 0, 2)})
        out = causal_attention(q, self.held("keys"), self.held("values"), start, scale,
                               base=self.base, window=self.window, softcap=softcap)
        self.trim()
        return out

    def copy(self) -> KVCache:
        return self.copy_rows(KVCache.__new__(KVCache))


def causal_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int,
                     scale: float, base: int = 0, window: int | None = None,
                     softcap: float | None = None) -> np.ndarray:
    """q [T, H, hd] at positions start.., keys/values [Hkv, N, hd] of positions base.. ->
    [T, H*hd]; with a `window`, query p sees keys p - window < j <= p (`kv_cache.py`); with
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
