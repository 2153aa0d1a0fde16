"""Gated GQA attention of one block, batched over a chunk (fixture README step 5, `B(u)`).

`h = ZC(norm_in)(u)` (A8); `q,k,v = W h`; causal depthwise taps on each; per head
`ZC(q_norm)`, `ZC(k_norm)`, RoPE on q and k (A8 q, k, v per head row); GQA (head h reads kv head
`h // (H/KV)`), scores `q.k / sqrt(qk)`, causal + window mask, softmax, `o = sum p v`;
upstream's fused attention (`flash=True`) pads q/k/v to `hd = max(qk, v)`, so the scores are
computed as `((q * sqrt(hd/qk)) . k) * (1/sqrt(hd))`, reproduced literally (A8 boundaries);
`o *= sigmoid(gate_proj h)` (A8); `o = out_proj o`.

Queries are laid out `[KV, positions * group, dim]` so every product is one batched BLAS matmul
over the kv heads, and a run of positions is a contiguous run of rows: a long chunk is scored
in blocks of `ATTN_BLOCK` positions, each against only the keys its rows can see (a chunk of
256 does the attention work of four chunks of 64 while its weight GEMMs run at M = 256).
What every layer of a chunk shares (RoPE rows, additive masks) is built once per chunk in a
`ChunkFrame`. The chunk's keys/values are written to the cache first and attended as a view
of it whenever position p sits in slot p (no per-layer copy of the context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...formats.needle3_geometry import V3Config
from ...kernels import pinned
from ...kernels.exact import a8_product
from ..ops import sigmoid, softmax
from .cache import LayerCache
from .exact_attention import attend_chunk
from .norms import zc_norm
from .step import LayerPlan, StepPlan
from .weights import LayerWeights

F32 = np.float32
ATTN_BLOCK = 64  # query positions scored together (bounds the causal waste and score memory)


@dataclass
class ChunkFrame:
    """Per-chunk constants every layer shares: positions, RoPE rows, additive masks."""

    start: int
    count: int
    cos: np.ndarray  # [C, 1, qk]: cos | cos
    sin: np.ndarray  # [C, 1, qk]: -sin | sin (rotate-half as one multiply-add)
    masks: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(cls, plan: StepPlan, start: int, count: int) -> ChunkFrame:
        rows = slice(start, start + count)
        return cls(start, count, plan.rope_cos[rows, None, :], plan.rope_sin[rows, None, :])

    def mask(self, first: int, window: int) -> np.ndarray:
        """[C, start + C - first]: 0 where the query (row) may see the key (column, positions
        from `first`), -inf elsewhere. Adding it is exact (x + 0 = x), like upstream's
        `where`. Layers whose window cannot bind inside this chunk share one mask."""
        end = self.start + self.count
        if window and end - 1 - first < window:
            window = 0
        key = (first, window)
        mask = self.masks.get(key)
        if mask is None:
            query = np.arange(self.start, end)[:, None]
            keys = np.arange(first, end)[None, :]
            allowed = keys <= query
            if window:
                allowed &= query - keys < window
            mask = np.where(allowed, F32(0.0), F32(-np.inf))
            self.masks[key] = mask
        return mask


def _conv(raw: np.ndarray, taps: np.ndarray | None, cache: LayerCache) -> np.ndarray:
    """Causal depthwise taps over raw q|k|v [C, width] (`taps[0] raw + taps[1] raw_-1 + ...`,
    summed in that order); advances the cache's conv tail. The lagged rows are read from raw
    and the tail in place (no concatenated copy of the chunk)."""
    if taps is None:
        return raw
    count = raw.shape[0]
    lag = taps.shape[0] - 1
    tail = cache.conv_tail  # [lag, width], oldest first
    mixed = taps[0] * raw
    term = np.empty_like(mixed)
    for back in range(1, lag + 1):
        split = min(back, count)  # rows before `split` reach back into the tail
        np.multiply(taps[back], tail[lag - back : lag - back + split], out=term[:split])
        np.multiply(taps[back], raw[: count - split], out=term[split:])
        mixed += term
    if lag:
        recent = raw if count >= lag else np.concatenate([tail, raw])
        cache.conv_tail = recent[-lag:].copy()
    return mixed


def _context(
    cache: LayerCache, start: int, keys: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Writes the chunk's keys [C, KV, qk] / values [C, KV, v] into the cache and returns the
    keys [KV, n, qk] / values [KV, n, v] of positions `first .. start+C-1` (oldest first)."""
    first = cache.context_start(start)
    end = start + keys.shape[0]
    if not cache.window or end <= cache.capacity:
        cache.write(start, keys, values)  # position p is in slot p: attend the store itself
        return cache.keys[:, first:end], cache.values[:, first:end], first
    old_keys, old_values = cache.context(start)  # a wrapping ring: unroll it
    keys_all = np.concatenate([old_keys, keys.transpose(1, 0, 2)], axis=1)
    values_all = np.concatenate([old_values, values.transpose(1, 0, 2)], axis=1)
    cache.write(start, keys, values)
    return keys_all, values_all, first


def attend(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, frame: ChunkFrame, first: int,
    window: int,
) -> np.ndarray:
    """Attention of the chunk's queries q [C, H, qk] over keys [KV, n, qk] / values [KV, n, v]
    of positions `first ..` -> [KV, C * group, v] (rows: position-major, head in group)."""
    count, heads, qk = q.shape
    kv_heads, _, vd = values.shape
    group = heads // kv_heads
    fused = max(qk, vd)
    qh = np.empty((kv_heads, count, group, qk), F32)
    np.multiply(q.reshape(count, kv_heads, group, qk).transpose(1, 0, 2, 3),
                F32(math.sqrt(fused / qk)), out=qh)
    qh = qh.reshape(kv_heads, count * group, qk)
    score_scale = F32(1.0 / math.sqrt(fused))
    keys_t = keys.transpose(0, 2, 1)
    mask = frame.mask(first, window)
    out = np.empty((kv_heads, count * group, vd), F32)
    start = frame.start
    for b0 in range(0, count, ATTN_BLOCK):
        b1 = min(count, b0 + ATTN_BLOCK)
        lo = max(0, start + b0 - window + 1 - first) if window else 0  # first key any row sees
        hi = start + b1 - first  # one past the last key any row sees
        rows = slice(b0 * group, b1 * group)
        scores = qh[:, rows] @ keys_t[:, :, lo:hi]  # [KV, rows, keys]
        scores *= score_scale
        by_position = scores.reshape(kv_heads, b1 - b0, group, hi - lo)
        by_position += mask[b0:b1, None, lo:hi]
        softmax(scores, out=scores)
        np.matmul(scores, values[:, lo:hi], out=out[:, rows])
    return out


def attention(
    cfg: V3Config,
    layer: LayerWeights,
    plan: LayerPlan,
    u: np.ndarray,
    cache: LayerCache,
    frame: ChunkFrame,
) -> np.ndarray:
    """Float numerics: `out_proj(sigmoid(gate) * attn)` for the chunk u [C, d] at positions
    frame.start..; writes the chunk's keys/values into the cache. `plan` is the block's
    `StepPlan` entry. (Deploy numerics: `attention_stacked`.)"""
    count = u.shape[0]
    heads, kv_heads, qk, vd = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim
    k_end = (heads + kv_heads) * qk
    v_end = k_end + kv_heads * vd
    h = zc_norm(u, layer.norm_in)
    fused = h @ layer.qkvg
    raw = _conv(fused[:, :v_end], layer.qkv_taps, cache)
    # ZC(q_norm) / ZC(k_norm) of every head row at once, then rotate-half RoPE as
    # `x cos2 + swap(x) sin2` (x1 cos - x2 sin == x1 cos + x2 (-sin) exactly)
    rows = _rope(zc_norm(raw[:, :k_end].reshape(count, heads + kv_heads, qk), plan.qk_scale),
                 frame)
    values = raw[:, k_end:v_end].reshape(count, kv_heads, vd)
    keys, stored, first = _context(cache, frame.start, rows[:, heads:], values)
    out = attend(rows[:, :heads], keys, stored, frame, first, cache.window)
    gate = sigmoid(fused[:, v_end:])  # [C, H*v], then times the attention in place
    gate4 = gate.reshape(count, kv_heads, heads // kv_heads, vd)
    np.multiply(out.reshape(kv_heads, count, -1, vd).transpose(1, 0, 2, 3), gate4, out=gate4)
    return gate @ layer.out_proj


def _rope(rows: np.ndarray, frame: ChunkFrame) -> np.ndarray:
    """Rotate-half RoPE of head rows [.., qk] in place, as `x cos2 + swap(x) sin2` (the one
    sequence of operations both numerics' attention use: the same bits as before)."""
    half = rows.shape[-1] // 2
    swapped = np.empty_like(rows)
    swapped[..., :half] = rows[..., half:]
    swapped[..., half:] = rows[..., :half]
    rows *= frame.cos
    swapped *= frame.sin
    rows += swapped
    return rows


# A stack of chunks from several sequences: (rows of u, that sequence's cache, its frame).
Parts = list[tuple[slice, object, ChunkFrame]]


def attention_parts(cfg: V3Config, layer: LayerWeights, plan: LayerPlan, u: np.ndarray,
                    parts: Parts) -> np.ndarray:
    """Float numerics' `attention` of a stack of chunks from several sequences, `parts` =
    (rows of u, that sequence's cache, its frame): each part on its own (BLAS results depend
    on the number of rows)."""
    if len(parts) == 1:
        return attention(cfg, layer, plan, u, parts[0][1], parts[0][2])
    return np.concatenate([attention(cfg, layer, plan, u[rows], cache, frame)
                           for rows, cache, frame in parts])


def attention_stacked(cfg: V3Config, layer: LayerWeights, plan: LayerPlan, u: np.ndarray,
                      parts: Parts) -> np.ndarray:
    """Deploy numerics' `attention` of a stack of chunks from several sequences: the exact A8
    products run once over all rows (the weights are read once; every row's result is its
    own, exact) and each sequence attends its own int8 cache (`exact_attention`)."""
    heads, kv_heads, qk, vd = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim
    k_end = (heads + kv_heads) * qk
    v_end = k_end + kv_heads * vd
    fused = a8_product(zc_norm(u, layer.norm_in), layer.qkvg)
    gate = pinned.sigmoid(fused[:, v_end:])
    for rows, cache, frame in parts:
        raw = _conv(fused[rows, :v_end], layer.qkv_taps, cache)
        cache.record_raw(frame.start, fused[rows, :v_end])
        count = raw.shape[0]
        # ZC(q_norm) / ZC(k_norm) per head row, then rotate-half RoPE (`attention`)
        heads_rows = _rope(
            zc_norm(raw[:, :k_end].reshape(count, heads + kv_heads, qk), plan.qk_scale), frame)
        values = raw[:, k_end:v_end].reshape(count, kv_heads, vd)
        out = attend_chunk(heads_rows[:, :heads], heads_rows[:, heads:], values, cache,
                           frame.start)
        gate[rows] *= out.reshape(count, heads * vd)
    return a8_product(gate, layer.out_proj)
