"""Constants folded once per model for the forward (`StepPlan`: per-block gate constants,
q/k norm scales and taps, RoPE rows as `cos|cos` and `-sin|sin`, engram table seeds), read by
the chunk forward (`attention.ChunkFrame`) and the native step (`native_block`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...formats.needle3_geometry import V3Config
from ..ops import ENGRAM_SEED_MULT
from .weights import LayerWeights

F32 = np.float32
MASK32 = 0xFFFFFFFF


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
    layers: tuple[LayerPlan | None, ...]
    rope_cos: np.ndarray  # [max_seq, qk]: cos | cos
    rope_sin: np.ndarray  # [max_seq, qk]: -sin | sin
    table_seeds: tuple[tuple[int, int], ...]  # (order, seed) of each engram table


def build_plan(cfg: V3Config, layers_in: Sequence[LayerWeights | None], cos: np.ndarray,
               sin: np.ndarray) -> StepPlan:
    """The folded constants of blocks `layers_in` (None entries, blocks a part does not hold,
    stay None) and the RoPE tables `cos`/`sin` [max_seq, qk/2]."""
    n, heads, kv = cfg.mhc_lanes, cfg.num_heads, cfg.num_kv_heads
    layers: list[LayerPlan | None] = []
    for layer in layers_in:
        if layer is None:
            layers.append(None)
            continue
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
        table_seeds=seeds,
    )


