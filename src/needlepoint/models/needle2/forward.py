"""One forward chunk: T new positions through embedding, engram, every block and the head
(needle2 README "Forward pass", upstream `decode._forward_cached`).

A prefill is this over chunks of the prompt, a decode step is this with T = 1; both fill
the same state, so a prefill followed by steps is the same computation as stepping
(summation order aside). The LM head runs only for the rows asked for.

Tracing: `trace(name, value)` is called with the intermediates the fixture's parity ladder
stores, named as its `p{k}_ladder_*` stems, in computation order. Per chunk:
`ladder_embedding_rows` [T, C], `ladder_engram_k`/`ladder_engram_v` [sites, T, C]; then per
layer `ladder_lanes` [T, n, C] (lanes entering it), `ladder_hpre` [T, n],
`ladder_engram_alpha` [T] (site layers only), `ladder_block_in` [T, C],
`ladder_k_cache_l0`/`ladder_v_cache_l0` [KV, T, hd] (layer 0), `ladder_attn_out`,
`ladder_mlp_out`, `ladder_block_out` [T, C], `ladder_hpost` [T, n], `ladder_hres`
[T, n, n]; then `ladder_lanes` once more (leaving the last layer),
`ladder_final_lane_mean`, `ladder_final_hidden` [T, C] and, when computed, `logits`.
`trace.LadderRecorder` stacks these into the fixture's array layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...formats.needle2_geometry import V2Config
from ..ops import rms_unit, rope_tables, sigmoid
from .attention import attention
from .engram import engram_keys_values
from .mhc import lane_sum, route, update_lanes
from .mlp import hadamard_mlp
from .state import V2State
from .weights import V2Weights

Trace = Callable[[str, np.ndarray], None]


@dataclass(frozen=True)
class Core:
    """Immutable model parts a forward chunk reads: geometry, weights, RoPE tables."""

    cfg: V2Config
    weights: V2Weights
    rope_cos: np.ndarray  # [max_seq_len, hd/2]
    rope_sin: np.ndarray
    embed_scale: np.float32

    @classmethod
    def build(cls, cfg: V2Config, weights: V2Weights) -> Core:
        cos, sin = rope_tables(np.arange(cfg.max_seq_len), cfg.head_dim, cfg.rope_theta)
        return cls(cfg, weights, cos, sin, np.float32(np.sqrt(np.float32(cfg.d_model))))


def forward_chunk(
    core: Core,
    state: V2State,
    tokens: np.ndarray,
    logit_rows: slice | None,
    trace: Trace | None = None,
    cells: np.ndarray | None = None,
) -> np.ndarray | None:
    """Run `tokens` (validated, fitting the state) at positions `state.position ...`.

    Returns logits `[rows, V]` for `logit_rows` of the chunk (None skips the LM head).
    `cells`, if given as [T, L+1, C], receives the probe-head cells: the scaled embedding
    and the lane mean after every layer (README "Probe heads").
    """
    cfg, w = core.cfg, core.weights
    count = tokens.shape[0]
    pos0 = state.position
    state.history[pos0 : pos0 + count] = tokens
    rows = w.embedding[tokens]
    if trace is not None:
        trace("ladder_embedding_rows", np.array(rows))
    x0 = rows * core.embed_scale
    lanes = np.repeat(x0[:, None, :], cfg.mhc_lanes, axis=1)
    if cells is not None:
        cells[:, 0] = x0
    engram_k, engram_v = engram_keys_values(w.engrams, cfg, state, count)
    if trace is not None:
        trace("ladder_engram_k", np.array(engram_k))
        trace("ladder_engram_v", np.array(engram_v))
    site_of = {site.layer: s for s, site in enumerate(w.engrams)}
    cos = core.rope_cos[pos0 : pos0 + count]
    sin = core.rope_sin[pos0 : pos0 + count]
    for index, (layer, mhc) in enumerate(zip(w.layers, w.mhc, strict=True)):
        if trace is not None:
            trace("ladder_lanes", np.array(lanes))
        hpre, hpost, hres = route(lanes, mhc)
        u = lane_sum(hpre, lanes)
        if trace is not None:
            trace("ladder_hpre", hpre)
        block_in = u
        site = site_of.get(index)
        if site is not None:
            # Gate on u, as decode.py does (seed 002 ENGRAM_GATE_SOURCE).
            score = np.sum(rms_unit(u) * rms_unit(engram_k[site]), axis=-1)
            alpha = sigmoid(score / np.sqrt(np.float32(cfg.d_model)))
            block_in = u + alpha[:, None] * engram_v[site]
            if trace is not None:
                trace("ladder_engram_alpha", alpha)
        if trace is not None:
            trace("ladder_block_in", block_in)
        attn = attention(
            layer.norm_in * rms_unit(block_in), layer, cfg, state, index, cos, sin, trace
        )
        x = block_in + layer.attn_gate * (layer.post_norm * rms_unit(attn))
        mlp = hadamard_mlp(x, layer)
        x += mlp
        if trace is not None:
            trace("ladder_attn_out", attn)
            trace("ladder_mlp_out", mlp)
            trace("ladder_block_out", np.array(x))
            trace("ladder_hpost", hpost)
            trace("ladder_hres", hres)
        x -= u  # y: the block's update, engram injection kept (seed 000 step 8)
        lanes = update_lanes(lanes, hres, hpost, x)
        if cells is not None:
            cells[:, index + 1] = lanes.mean(axis=1)
    state.position = pos0 + count
    if trace is not None:
        trace("ladder_lanes", np.array(lanes))
    if logit_rows is None and trace is None:
        return None
    mean = lanes.mean(axis=1) if logit_rows is None else lanes[logit_rows].mean(axis=1)
    hidden = w.final_norm * rms_unit(mean)
    if trace is not None:
        full = lanes.mean(axis=1)
        trace("ladder_final_lane_mean", full)
        trace("ladder_final_hidden", w.final_norm * rms_unit(full))
    if logit_rows is None:
        return None
    logits = hidden @ w.embedding.T
    if trace is not None:
        trace("logits", logits)
    return logits
