"""Gated GQA self-attention over the ring KV cache (needle2 README "Forward pass" 3,
`block:` bullet; seed 000 step 7; seed 002 `_attn_cached`).

A chunk of T new positions `pos0 .. pos0+T-1` attends over the cached positions still in the
ring plus its own keys: query t may read key l when `l <= t` and, with a window W > 0,
`t - l < W`. The chunk's keys are cached after the scores are taken, so a chunk longer than
the ring still sees every key its window needs. A single-token step writes first and
attends over the ring in place (no concatenation): the slot it overwrites held position
`pos0 - cache_len`, already outside the window.
"""

from __future__ import annotations

import numpy as np

from ...formats.needle2_geometry import V2Config
from ..ops import apply_rope, rms_unit, sigmoid, softmax
from .state import V2State
from .weights import LayerWeights


def slot_positions(next_position: int, cache_len: int) -> np.ndarray:
    """Logical position held by each filled ring slot once `next_position` tokens are in."""
    filled = min(next_position, cache_len)
    slots = np.arange(filled)
    return next_position - 1 - (next_position - 1 - slots) % cache_len


def write_kv(state: V2State, layer: int, pos0: int, keys: np.ndarray, values: np.ndarray) -> None:
    """Store new keys/values `[KV, T, hd]` in their ring slots (the last cache_len of them)."""
    count = keys.shape[1]
    keep = min(count, state.cache_len)
    first = pos0 + count - keep
    slots = np.arange(first, pos0 + count) % state.cache_len
    state.k_cache[layer][:, slots] = keys[:, count - keep :]
    state.v_cache[layer][:, slots] = values[:, count - keep :]


def attention(
    h: np.ndarray,
    layer: LayerWeights,
    cfg: V2Config,
    state: V2State,
    index: int,
    cos: np.ndarray,
    sin: np.ndarray,
    trace: object = None,
) -> np.ndarray:
    """The attention branch for block input `h` [T, C] (already `zcrms(b, norm_in)`), up to
    and including `out_proj` (the post-norm and gate are the caller's). `cos`/`sin` are the
    RoPE rows of the chunk's positions, [T, hd/2]."""
    count = h.shape[0]
    heads, kv_heads, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q_end, k_end = heads * hd, (heads + kv_heads) * hd
    v_end = k_end + kv_heads * hd
    proj = h @ layer.w_qkvg
    rope_cos, rope_sin = cos[:, None, :], sin[:, None, :]
    q = layer.q_norm * rms_unit(proj[:, :q_end].reshape(count, heads, hd))
    q = apply_rope(q, rope_cos, rope_sin)
    k = layer.k_norm * rms_unit(proj[:, q_end:k_end].reshape(count, kv_heads, hd))
    k = apply_rope(k, rope_cos, rope_sin).transpose(1, 0, 2)  # [KV, T, hd] as cached
    v = proj[:, k_end:v_end].reshape(count, kv_heads, hd).transpose(1, 0, 2)
    if trace is not None and index == 0:
        trace("ladder_k_cache_l0", np.array(k))
        trace("ladder_v_cache_l0", np.array(v))
    pos0 = state.position
    if count == 1:
        write_kv(state, index, pos0, k, v)
        key_pos = slot_positions(pos0 + 1, state.cache_len)
        keys = state.k_cache[index][:, : key_pos.size]
        values = state.v_cache[index][:, : key_pos.size]
    else:
        key_pos = np.concatenate([slot_positions(pos0, state.cache_len), pos0 + np.arange(count)])
        filled = key_pos.size - count
        keys = np.concatenate([state.k_cache[index][:, :filled], k], axis=1)
        values = np.concatenate([state.v_cache[index][:, :filled], v], axis=1)
        write_kv(state, index, pos0, k, v)
    mixed = _attend(q, keys, values, pos0 + np.arange(count), key_pos, state.kv_window)
    gated = mixed * sigmoid(proj[:, v_end:])
    return gated @ layer.w_out


def _attend(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    query_pos: np.ndarray,
    key_pos: np.ndarray,
    window: int,
) -> np.ndarray:
    """Softmax attention, GQA (query head h reads KV head h // (H/KV)), scale 1/sqrt(hd).

    q [T, H, hd]; keys/values [KV, N, hd]; returns [T, H*hd]."""
    count, heads, hd = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    grouped = q.reshape(count, kv_heads, group, hd).transpose(1, 2, 0, 3)
    grouped = grouped.reshape(kv_heads, group * count, hd)
    scores = np.matmul(grouped, keys.transpose(0, 2, 1))
    scores *= np.float32(1.0 / np.sqrt(hd))
    scores = scores.reshape(kv_heads, group, count, -1)
    lag = query_pos[:, None] - key_pos[None, :]
    allowed = lag >= 0
    if window > 0:
        allowed &= lag < window
    if not allowed.all():
        scores = np.where(allowed, scores, np.float32(-np.inf))
    probs = softmax(scores, axis=-1).reshape(kv_heads, group * count, -1)
    out = np.matmul(probs, values).reshape(kv_heads, group, count, hd)
    return out.transpose(2, 0, 1, 3).reshape(count, heads * hd)
