"""The blocks of a chunk of positions (fixture README "Forward pass", step 5): the one loop
over blocks that a session, `forward`, `run_batch` and a pipeline stage (`needlepoint.stages`,
through `layer_range`) all run, so they agree by construction.

`run_blocks` runs blocks `first .. end-1` over the stacked rows of one or several sequences'
chunks: with the model's native plan (deploy numerics, library loaded) as one C call
(`native_block`), else block by block through `run_block`, the numpy reference of the same
operations. Each sequence attends its own caches (advanced in place); the engram sites' keys
and tapped values come from whoever holds the tokens (the session's forward, or the head of a
staged model). The lane means after each block (the confidence cells) go to a cells array
and/or straight to the sequences' `streaming` cell states.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .attention import ChunkFrame
from .engram import engram_gate
from .mhc import route
from .native_block import cache_pointers
from .norms import zc_norm
from .protocol import BlockModel

F32 = np.float32
SiteKV = tuple[np.ndarray, np.ndarray]


def run_block(
    model: BlockModel,
    index: int,
    lanes: np.ndarray,
    parts: list[tuple[slice, object, ChunkFrame]],
    site_kv: SiteKV | None,
) -> np.ndarray:
    """Lanes after block `index` (README step 5, `B(u)` and mHC) for lanes [R, n, d]: the rows
    of one or several sequences' chunks, `parts` = (their rows, that sequence's cache of this
    block, its ChunkFrame). `site_kv`: the engram site's key and tapped value for every row.
    The numerics' own operations throughout (`numerics.py`)."""
    cfg, weights, num = model.config, model.weights, model.num
    layer = weights.layers[index]
    plan = num.native_plan(model)
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
    u, hpost, hres = route(lanes, layer.mhc, num)
    block = u
    if site_kv is not None:
        block = engram_gate(u, site_kv[0], site_kv[1], num.sigmoid)
    attn = num.attention(cfg, layer, model.step_plan.layers[index], block, parts)
    # block + gate * ZC(attn), block + MLP(ZC(block)), block - u: in place, same sums
    attn = zc_norm(attn, layer.post_norm)
    attn *= layer.attn_gate
    attn += block
    block = attn
    update = num.hadamard_mlp(zc_norm(block, layer.pre_hada), layer.mlp, weights.hada_p1,
                              weights.hada_p2, cfg.hada_n)
    update += block
    update -= u
    del block, attn, u
    return num.mix_lanes(hres, lanes, hpost, update)


def run_blocks(
    model: BlockModel,
    first: int,
    end: int,
    lanes: np.ndarray,
    parts: Sequence[tuple[slice, Any, int]],
    sites: Mapping[int, SiteKV],
    cells: np.ndarray | None = None,
    cells_offset: int = 0,
    streams: Sequence[tuple[slice, Any]] = (),
) -> np.ndarray:
    """Blocks `first .. end-1` over lanes [R, n, d] (float32; with the native plan written in
    place). `parts` = (rows of the lanes, that sequence's caches indexed by block, its first
    position); `sites`: engram site index -> (keys [R, d], tapped values [R, d]), read when
    a block asks (a lazy mapping keeps one site's pair alive at a time). The lane means
    after block l go to `cells[:, l - first + cells_offset]` and, for each (rows,
    `streaming` cell state) of `streams`, to that state as cell row l + 1."""
    num, layers = model.num, model.weights.layers
    plan = num.native_plan(model)
    if plan is not None:  # every block in one native call (np_v3_block.h), the same bits
        held = [cache_pointers([caches[i] for i in range(first, end)]) for _, caches, _ in parts]
        c_parts = [(rows.start, rows.stop - rows.start, start, ctypes.addressof(pointers))
                   for (rows, _, start), pointers in zip(parts, held, strict=True)]
        wanted = {layers[i].engram_site for i in range(first, end)} - {None}
        plan.blocks(first, end, lanes, c_parts, {site: sites[site] for site in wanted},
                    cells, cells_offset)
        return lanes
    frames = [ChunkFrame.build(model.step_plan, start, rows.stop - rows.start)
              for rows, _, start in parts]
    mean = np.empty((lanes.shape[0], lanes.shape[2]), F32) if streams and cells is None \
        else None
    for index in range(first, end):
        block_parts = [(rows, caches[index], frame)
                       for (rows, caches, _), frame in zip(parts, frames, strict=True)]
        site = layers[index].engram_site
        lanes = run_block(model, index, lanes, block_parts,
                          None if site is None else sites[site])
        if cells is not None or streams:
            row = cells[:, index - first + cells_offset] if cells is not None else mean
            num.cell_row(lanes, out=row)
            for rows, state in streams:
                state.add(index + 1, row[rows][:, None, :])
    return lanes
