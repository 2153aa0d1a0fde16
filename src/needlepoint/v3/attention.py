"""Gated GQA attention of one block, batched over a chunk (fixture README step 5, `B(u)`).

`h = ZC(norm_in)(u)` (A8); `q,k,v = W h`; causal depthwise taps on each; per head
`ZC(q_norm)`, `ZC(k_norm)`, RoPE on q and k (A8 q, k, v per head row); GQA (head h reads kv head
`h // (H/KV)`), scores `q.k / sqrt(qk)`, causal + window mask, softmax, `o = sum p v`;
upstream's fused attention (`flash=True`) pads q/k/v to `hd = max(qk, v)`, so the scores are
computed as `((q * sqrt(hd/qk)) . k) * (1/sqrt(hd))`, reproduced literally (A8 boundaries);
`o *= sigmoid(gate_proj h)` (A8); `o = out_proj o`.

Heads are laid out `[KV, group, positions, dim]` so every product is one batched matmul over
kv heads: no Python loop over heads or positions.
"""

from __future__ import annotations

import math

import numpy as np

from ..ops import apply_rope, fake_quant_a8, sigmoid, softmax
from .cache import LayerCache
from .config import V3Config
from .norms import zc_norm
from .weights import LayerWeights

F32 = np.float32


def project_qkv(
    cfg: V3Config,
    layer: LayerWeights,
    h: np.ndarray,
    cache: LayerCache,
    cos: np.ndarray,
    sin: np.ndarray,
    quantized: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q [C, H, qk], k [C, KV, qk], v [C, KV, v] and the gate logits [C, H*v] of a chunk whose
    normed input is h [C, d]; advances the cache's conv tail."""
    count = h.shape[0]
    heads, kv_heads, qk, vd = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim
    q_end = heads * qk
    k_end = q_end + kv_heads * qk
    v_end = k_end + kv_heads * vd
    fused = h @ layer.qkvg
    raw = fused[:, :v_end]
    if layer.qkv_taps is not None:
        taps = layer.qkv_taps
        lag = taps.shape[0] - 1
        history = np.concatenate([cache.conv_tail, raw]) if lag else raw
        mixed = taps[0] * raw
        for back in range(1, taps.shape[0]):
            mixed = mixed + taps[back] * history[lag - back : lag - back + count]
        if lag:
            cache.conv_tail = history[-lag:].copy()
        raw = mixed
    rope_cos, rope_sin = cos[:, None, :], sin[:, None, :]
    q = apply_rope(zc_norm(raw[:, :q_end].reshape(count, heads, qk), layer.q_norm),
                   rope_cos, rope_sin)
    k = apply_rope(zc_norm(raw[:, q_end:k_end].reshape(count, kv_heads, qk), layer.k_norm),
                   rope_cos, rope_sin)
    v = raw[:, k_end:v_end].reshape(count, kv_heads, vd)
    if quantized:
        q, k, v = fake_quant_a8(q), fake_quant_a8(k), fake_quant_a8(v)
    return q, k, v, fused[:, v_end:]


def _scores(qh: np.ndarray, keys: np.ndarray, v_dim: int) -> np.ndarray:
    """Scaled scores [KV, rows, n] as upstream's fused attention computes them."""
    qk = qh.shape[-1]
    fused = max(qk, v_dim)
    raw = (qh * F32(math.sqrt(fused / qk))) @ keys.transpose(0, 2, 1)
    return raw * F32(1.0 / math.sqrt(fused))


def attend_chunk(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, first: int, window: int
) -> np.ndarray:
    """Attention of queries at positions start .. start+C-1 (q [C, H, qk]) over the keys/values
    of positions first .. (keys [KV, n, qk], values [KV, n, v], oldest first) -> [C, H*v]."""
    count, heads, qk = q.shape
    kv_heads, length, vd = values.shape
    group = heads // kv_heads
    qh = q.reshape(count, kv_heads, group, qk).transpose(1, 2, 0, 3).reshape(kv_heads, -1, qk)
    scores = _scores(qh, keys, vd)  # [KV, G*C, n]
    query_pos = np.arange(start, start + count)[:, None]
    key_pos = np.arange(first, first + length)[None, :]
    allowed = key_pos <= query_pos
    if window:
        allowed &= query_pos - key_pos < window
    scores = np.where(np.tile(allowed, (group, 1))[None], scores, F32(-np.inf))
    out = softmax(scores, axis=-1) @ values  # [KV, G*C, v]
    return out.reshape(kv_heads, group, count, vd).transpose(2, 0, 1, 3).reshape(count, -1)


def attend_step(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """One query q [1, H, qk] over every visible key (keys [KV, n, qk]) -> [1, H*v]."""
    _, heads, qk = q.shape
    kv_heads = keys.shape[0]
    qh = q.reshape(kv_heads, heads // kv_heads, qk)
    scores = _scores(qh, keys, values.shape[-1])  # [KV, G, n]
    return (softmax(scores, axis=-1) @ values).reshape(1, -1)


def attention(
    cfg: V3Config,
    layer: LayerWeights,
    u: np.ndarray,
    cache: LayerCache,
    start: int,
    cos: np.ndarray,
    sin: np.ndarray,
    quantized: bool,
) -> np.ndarray:
    """`out_proj(A8(sigmoid(gate) * attn))` for the chunk u [C, d] at positions start..;
    writes the chunk's keys/values into the cache."""
    h = zc_norm(u, layer.norm_in)
    if quantized:
        h = fake_quant_a8(h)
    q, k, v, gate = project_qkv(cfg, layer, h, cache, cos, sin, quantized)
    if q.shape[0] == 1:
        cache.write(start, k, v)
        out = attend_step(q, *cache.visible(start))
    else:
        first = cache.context_start(start)
        old_keys, old_values = cache.context(start)
        keys = np.concatenate([old_keys, k.transpose(1, 0, 2)], axis=1)
        values = np.concatenate([old_values, v.transpose(1, 0, 2)], axis=1)
        out = attend_chunk(q, keys, values, start, first, cache.window)
        cache.write(start, k, v)
    out = out * sigmoid(gate)
    if quantized:
        out = fake_quant_a8(out)
    return out @ layer.out_proj
