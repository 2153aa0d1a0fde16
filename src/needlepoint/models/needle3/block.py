"""One transformer block of a chunk of positions (fixture README "Forward pass", step 5): the
code a single-process session and a pipeline stage (`needlepoint.stages`) both run, so the
two agree by construction.

`run_block` takes the block's lanes, the cache of each sequence in them (advanced in place)
and, at an engram site, the site's key and tapped value (computed by whoever holds the
tokens); it returns the new lanes. `cell_row` is the lane mean after a block (the parity-ladder cell
and the confidence head's input).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np

from .attention import ChunkFrame, attention_parts
from .engram import engram_gate
from .exact_ops import lane_mean, mix_lanes
from .mhc import route, scatter
from .mlp import hadamard_mlp
from .native_block import cache_pointers, native_plan
from .norms import zc_norm

if TYPE_CHECKING:  # pragma: no cover
    from .model import V3Model

F32 = np.float32


def run_block(
    model: V3Model,
    index: int,
    lanes: np.ndarray,
    parts: list[tuple[slice, object, ChunkFrame]],
    site_kv: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """Lanes after block `index` (README step 5, `B(u)` and mHC) for lanes [R, n, d]: the rows
    of one or several sequences' chunks, `parts` = (their rows, that sequence's cache of this
    block, its ChunkFrame). `site_kv`: the engram site's key and tapped value for every row."""
    cfg, weights, quantized = model.config, model.weights, model.quantized
    layer = weights.layers[index]
    plan = native_plan(model)
    if plan is not None:  # the same operations in one native call (np_v3_block.h)
        out = np.array(lanes, F32, order="C")
        rows = out.shape[0]
        held = [cache_pointers([cache]) for _, cache, _ in parts]
        c_parts = [(rows_of.start or 0, len(range(rows)[rows_of]), frame.start,
                    ctypes.addressof(pointers))
                   for (rows_of, _, frame), pointers in zip(parts, held, strict=True)]
        sites = None if site_kv is None else {layer.engram_site: site_kv}
        plan.blocks(index, index + 1, out, c_parts, sites)
        return out
    u, hpost, hres = route(lanes, layer.mhc, quantized)
    block = u
    if site_kv is not None:
        block = engram_gate(u, site_kv[0], site_kv[1], quantized)
    attn = attention_parts(cfg, layer, model.step_plan.layers[index], block, parts, quantized)
    # block + gate * ZC(attn), block + MLP(ZC(block)), block - u: in place, same sums
    attn = zc_norm(attn, layer.post_norm)
    attn *= layer.attn_gate
    attn += block
    block = attn
    update = hadamard_mlp(zc_norm(block, layer.pre_hada), layer.mlp, weights.hada_p1,
                          weights.hada_p2, cfg.hada_n, pinned=quantized)
    update += block
    update -= u
    del block, attn, u
    if quantized:
        return mix_lanes(hres, lanes, hpost, update)
    return scatter(lanes, update, hpost, hres)


def cell_row(lanes: np.ndarray, quantized: bool, out: np.ndarray | None = None) -> np.ndarray:
    """Mean over the lanes [C, n, d] -> [C, d] (deploy: in lane order, `exact_ops.lane_mean`)."""
    if quantized:
        if out is None:
            return lane_mean(lanes)
        out[...] = lane_mean(lanes)
        return out
    if out is None:
        out = np.empty((lanes.shape[0], lanes.shape[2]), F32)
    np.add.reduce(lanes, axis=1, out=out)
    out /= F32(lanes.shape[1])
    return out
