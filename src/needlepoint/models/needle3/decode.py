"""The one-token decode step of float numerics (`NeedleFloat.folded_step`): the chunk
forward (`block.run_blocks`) specialised to a single position, with the same arithmetic in far
fewer numpy calls (fixture README step 5). Deploy numerics step through the chunk forward
itself (a step is a chunk of one: the same bits as in any prefill).

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
from collections.abc import Sequence

import numpy as np

from ...kernels.cq import gather_rows
from ..ops import ENGRAM_FNV_PRIME, sigmoid, sinkhorn, softmax
from .cache import LayerCache
from .engram import EngramTail
from .fastnum import F32, einsum, gemv, inv_rms, mean_into, zc, zc_rows
from .protocol import BlockModel
from .sinkhorn import sinkhorn4
from .step import MASK32
from .weights import rotate

TWO = F32(2.0)


def _engram_step(model: BlockModel, tail: EngramTail, token: int, position: int):
    """Keys [S, d] and tapped values [S, d] of the engram sites at this position; advances
    the engram tail in place (README step 2, as `engram.EngramChunk`)."""
    cfg, sites, plan = model.config, model.weights.engram, model.step_plan
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


def decode_step(model: BlockModel, caches: Sequence[LayerCache], tail: EngramTail,
                cells: np.ndarray | None, position: int, token: int, want_logits: bool
                ) -> np.ndarray | None:
    """Consume `token` at `position`: advances the caches and the engram tail in place,
    writes the confidence cells [L+1, d] to `cells` (None: no head); logits [1, vocab_out]
    or None."""
    cfg, weights = model.config, model.weights
    plan = model.step_plan
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
    engram_k, engram_v = _engram_step(model, tail, token, position)
    lanes = np.empty((n, d), F32)
    lanes[:] = x0
    if cells is not None:
        cells[0] = x0
    for index, (layer, cache, lp) in enumerate(
        zip(weights.layers, caches, plan.layers, strict=True)
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
            weight = sigmoid(F32(affinity) / F32(math.sqrt(d)))
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
        attn = einsum("kgn,knv->kgv", softmax(scores, out=scores), stored).reshape(-1)
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
    if not want_logits:
        return None
    mean = mean_into(lanes, axis=0)[0]
    hidden = zc(mean, weights.final_norm)
    return gemv(rotate(hidden), weights.lm_head)[None]  # rotated domain (weights.py)


def _mlp_step(x: np.ndarray, mlp, weights, hada_n: int) -> np.ndarray:
    """`mlp.hadamard_mlp` of one vector x [d]."""
    width = x.shape[0]
    logits = x @ mlp.cond_v
    cond = softmax(logits, out=logits) @ mlp.cond_u
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
