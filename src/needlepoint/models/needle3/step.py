"""The one-token decode step of float numerics: the chunked forward (`session._chunk`)
specialised to a single position, with the same arithmetic in far fewer numpy calls (fixture
README step 5). Deploy numerics step through the native step (`native_block`) or its
reference, the chunk path, instead.

A decode step is memory-bound on the float32 weights (~200 MB for the shipped geometry); what
is left is per-call overhead, so per block this path keeps numpy calls to a minimum: constants
are folded once per model (`StepPlan`), vectors stay 1-D, mHC's 4 x 4 Sinkhorn runs on Python
floats, products with weights are `fastnum.gemv` (einsum: bandwidth-bound, no BLAS threads),
and the caches are written in place. Ring caches are attended in ring order (softmax is
order-free). Numerics: the same float32 operations in the same order as the chunked path up
to summation order inside reductions and products (float parity tests: 2e-5 of the logit
range between stepping and prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...kernels.cq import gather_rows
from ..ops import ENGRAM_FNV_PRIME, ENGRAM_SEED_MULT, sinkhorn
from .fastnum import (
    F32,
    einsum,
    gemv,
    inv_rms,
    mean_into,
    sigmoid,
    softmax_rows,
    zc,
    zc_rows,
)
from .sinkhorn import sinkhorn4
from .weights import rotate

if TYPE_CHECKING:  # pragma: no cover
    from .model import V3Model
    from .session import V3Session

MASK32 = 0xFFFFFFFF
TWO = F32(2.0)


@dataclass(frozen=True)
class LayerPlan:
    """Per-block constants of the step, folded once from `LayerWeights`."""

    gate_scale: np.ndarray  # [2n]: a_pre (n times), a_post (n times)
    gate_bias: np.ndarray  # [2n]: b_pre | b_post
    gate_offset: np.ndarray  # [2n]: pre_offset | post_offset
    qk_scale: np.ndarray  # [H + KV, qk]: 1 + q_norm per q head, 1 + k_norm per k head
    taps: np.ndarray | None  # [taps, q|k|v]: newest first, as stored


@dataclass(frozen=True)
class StepPlan:
    layers: tuple[LayerPlan, ...]
    rope_cos: np.ndarray  # [max_seq, qk]: cos | cos
    rope_sin: np.ndarray  # [max_seq, qk]: -sin | sin
    rope_swap: np.ndarray  # [qk]: column order of rotate-half's swap (second half first)
    table_seeds: tuple[tuple[int, int], ...]  # (order, seed) of each engram table
    embed_scale: np.float32


def build_plan(model: V3Model) -> StepPlan:
    cfg, weights = model.config, model.weights
    n, heads, kv = cfg.mhc_lanes, cfg.num_heads, cfg.num_kv_heads
    layers = []
    for layer in weights.layers:
        mhc = layer.mhc
        layers.append(
            LayerPlan(
                gate_scale=np.repeat(np.asarray([mhc.a_pre, mhc.a_post], F32), n),
                gate_bias=np.concatenate([mhc.b_pre, mhc.b_post]).astype(F32),
                gate_offset=np.concatenate([mhc.pre_offset, mhc.post_offset]).astype(F32),
                qk_scale=np.concatenate(
                    [np.tile(layer.q_norm, (heads, 1)), np.tile(layer.k_norm, (kv, 1))]
                ),
                taps=layer.qkv_taps,
            )
        )
    cos, sin = model.rope_cos, model.rope_sin
    stride = cfg.engram_seed_heads or cfg.engram_heads
    seeds = tuple(
        (order, (ENGRAM_SEED_MULT * (oi * stride + head + 1)) & MASK32)
        for oi, order in enumerate(cfg.engram_orders)
        for head in range(cfg.engram_heads)
    )
    return StepPlan(
        layers=tuple(layers),
        rope_cos=np.concatenate([cos, cos], axis=1),
        rope_sin=np.concatenate([-sin, sin], axis=1),
        rope_swap=np.roll(np.arange(cfg.qk_head_dim), cfg.qk_head_dim // 2),
        table_seeds=seeds,
        embed_scale=np.sqrt(F32(cfg.d_model)),
    )


def _engram_step(session: V3Session, plan: StepPlan, token: int, position: int):
    """Keys [S, d] and tapped values [S, d] of the engram sites at this position; advances
    the engram tail in place (README step 2, as `engram.EngramChunk`)."""
    model = session.model
    cfg, sites = model.config, model.weights.engram
    tail = session.engram_tail
    history = [int(t) for t in tail.tokens] + [token]
    last = len(history) - 1
    slots = cfg.engram_slots
    rows = []
    valid = []
    for table, (order, seed) in enumerate(plan.table_seeds):
        acc = seed
        for back in range(order):
            previous = history[last - back] if back <= last else 0
            acc = ((acc ^ previous) * ENGRAM_FNV_PRIME) & MASK32
        acc ^= acc >> 15
        rows.append(acc % slots + table * slots)
        valid.append(position >= order - 1)
    keep = max(cfg.engram_orders, default=1) - 1
    tail.tokens = np.asarray(history[-keep:] if keep else [], np.int64)
    if not sites:
        return None, None
    d = cfg.d_model
    lookup = gather_rows([site.tables for site in sites], rows)  # [S, tables, sub]
    if not all(valid):
        lookup *= np.asarray(valid, F32)[None, :, None]
    lookup = lookup.reshape(len(sites), -1)
    keys = np.empty((len(sites), d), F32)
    values = np.empty((len(sites), d), F32)
    taps_count, dilation = cfg.engram_conv_taps, cfg.engram_conv_dilation
    store = tail.values  # [S, reach, d], oldest first
    reach = store.shape[1]
    for index, site in enumerate(sites):
        projected = gemv(lookup[index], site.key_value)
        keys[index] = projected[:d]
        raw = projected[d:]
        tapped = site.taps[0] * raw
        for tap in range(1, taps_count):
            tapped += site.taps[tap] * store[index, reach - tap * dilation]
        values[index] = tapped
        if reach:
            store[index, :-1] = store[index, 1:]
            store[index, -1] = raw
    return keys, values


def decode_step(session: V3Session, token: int, want_logits: bool) -> np.ndarray | None:
    """Consume `token` at `session.position`; logits [1, vocab_out] or None."""
    model = session.model
    cfg, weights = model.config, model.weights
    plan = model.step_plan
    position = session.position
    n, d = cfg.mhc_lanes, cfg.d_model
    heads, kv, qk, vd = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim
    group = heads // kv
    q_end = heads * qk
    k_end = q_end + kv * qk
    v_end = k_end + kv * vd
    hd = max(qk, vd)
    q_scale, score_scale = F32(math.sqrt(hd / qk)), F32(1.0 / math.sqrt(hd))
    cos, sin = plan.rope_cos[position], plan.rope_sin[position]
    swap = plan.rope_swap
    small_sinkhorn = n == 4
    n2 = 2 * n

    x0 = weights.embedding_rows([token])[0] * plan.embed_scale
    engram_k, engram_v = _engram_step(session, plan, token, position)
    lanes = np.empty((n, d), F32)
    lanes[:] = x0
    cells = session.pending_cells_row(len(weights.layers) + 1, d)
    if cells is not None:
        cells[0] = x0
    for index, (layer, cache, lp) in enumerate(
        zip(weights.layers, session.caches, plan.layers, strict=True)
    ):
        # -- mHC routing (mhc.route)
        flat = lanes.reshape(-1)
        normed = flat * inv_rms(flat)
        mhc = layer.mhc
        mixed = gemv(normed, mhc.phi)
        gates = lp.gate_scale * mixed[:n2]  # (a m + b) + offset, in place
        gates += lp.gate_bias
        gates += lp.gate_offset
        sigmoid(gates, out=gates)
        hpost = gates[n:] * TWO
        res = mhc.a_res * mixed[n2:].reshape(n, n) + mhc.b_res
        hres = sinkhorn4(res) if small_sinkhorn else sinkhorn(res[None])[0]
        u = gemv(gates[:n], lanes)
        block = u
        if layer.engram_site is not None:  # engram.engram_gate
            site = layer.engram_site
            key = engram_k[site]
            affinity = einsum("i,i->", u * inv_rms(u), key * inv_rms(key))
            weight = F32(1.0) / (F32(1.0) + np.exp(-(F32(affinity) / F32(math.sqrt(d)))))
            block = u + weight * engram_v[site]
        # -- attention (attention.attention)
        h = zc(block, layer.norm_in)
        fused = gemv(h, layer.qkvg)
        raw = fused[:v_end]
        if lp.taps is not None:
            raw = cache.conv_step(raw, lp.taps)
        qk_rows = zc_rows(raw[:k_end].reshape(heads + kv, qk), lp.qk_scale)
        swapped = qk_rows.take(swap, axis=1)  # rotate-half: second half first
        qk_rows *= cos
        swapped *= sin
        qk_rows += swapped
        values = raw[k_end:v_end].reshape(kv, vd)
        cache.write_one(position, qk_rows[heads:], values)
        keys, stored = cache.visible(position)
        query = qk_rows[:heads].reshape(kv, group, qk) * q_scale
        scores = einsum("kgd,knd->kgn", query, keys)
        scores *= score_scale
        attn = einsum("kgn,knv->kgv", softmax_rows(scores), stored).reshape(-1)
        attn *= sigmoid(fused[v_end:])
        attn = gemv(attn, layer.out_proj)
        block = block + layer.attn_gate * zc(attn, layer.post_norm)
        # -- Hadamard MLP (mlp.hadamard_mlp)
        block = block + _mlp_step(zc(block, layer.pre_hada), layer.mlp, weights, cfg.hada_n)
        # -- mHC scatter (mhc.scatter)
        block -= u
        lanes = hres @ lanes
        lanes += hpost[:, None] * block
        if cells is not None:
            mean_into(lanes, axis=0, out=cells[index + 1 : index + 2])  # lanes.mean(axis=0)
    session.push_token(token)
    if not want_logits:
        return None
    mean = mean_into(lanes, axis=0)[0]
    hidden = zc(mean, weights.final_norm)
    return gemv(rotate(hidden), weights.lm_head)[None]  # rotated domain (weights.py)


def _mlp_step(x: np.ndarray, mlp, weights, hada_n: int) -> np.ndarray:
    """`mlp.hadamard_mlp` of one vector x [d]."""
    width = x.shape[0]
    logits = x @ mlp.cond_v
    cond = softmax_rows(logits) @ mlp.cond_u
    cond += F32(1.0)
    z = np.zeros(hada_n, F32)  # d1 * pad(x): the padding stays zero
    np.multiply(mlp.d1[:width], x, out=z[:width])
    (w1a, w1b), (w2a, w2b), (w3a, w3b) = mlp.stages
    ba, bb = w1a.shape[0], w1b.shape[0]
    z = (w1a.T @ (z.reshape(ba, bb) @ w1b)).reshape(-1).take(weights.hada_p1)  # take: > [p]
    z *= mlp.d2 * cond  # upstream's order: (d2 * cond) * z
    z += mlp.b2
    z *= sigmoid(z)
    z = (w2a.T @ (z.reshape(ba, bb) @ w2b)).reshape(-1).take(weights.hada_p2)
    z *= mlp.d3
    z = (w3a.T @ (z.reshape(ba, bb) @ w3b)).reshape(-1)
    out = z[:width]
    out *= mlp.d4[:width]
    return out
