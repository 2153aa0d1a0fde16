"""Chunks of several sequences in one pass (continuous batching; docs/numerics.md).

`run_batch(model, requests)` appends each request's ids to its own session, as
`session.prefill(ids)` / `session.extend(ids)` would, but runs one stacked pass per round of
chunks: every block's products read the weights once for the rows of all sequences, and each
sequence attends its own cache. Deploy numerics are row-wise exact and batch-invariant, so a
request's logits are the same bits alone or among others. Float numerics run each request
on its own (BLAS results depend on the number of rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .attention import ChunkFrame
from .block import cell_row, run_block
from .engram import EngramChunk
from .exact_ops import product
from .native_block import native_plan, session_pointers
from .norms import zc_norm

if TYPE_CHECKING:  # pragma: no cover
    from .model import V3Model
    from .session import V3Session

F32 = np.float32


def run_batch(
    model: V3Model, requests: Sequence[tuple[V3Session, Sequence[int] | np.ndarray, bool]]
) -> list[np.ndarray]:
    """Per request (session, ids, all_logits): logits [len(ids), vocab] if all_logits else the
    last row [vocab], after appending ids to that session. Sessions must be distinct."""
    sessions = [session for session, _, _ in requests]
    if len({id(s) for s in sessions}) != len(sessions):
        raise ValueError("run_batch: each session may appear once per call")
    tokens = [session.model.check_ids(ids, session.position) for session, ids, _ in requests]
    for session in sessions:
        if session.model is not model:
            raise ValueError("run_batch: every session must belong to this model")
    if not model.quantized:
        return [
            session.extend(ids) if every else session.prefill(ids)
            for (session, _, every), ids in zip(requests, tokens, strict=True)
        ]
    outputs: list[list[np.ndarray]] = [[] for _ in requests]
    offsets = [0] * len(requests)
    while True:
        items = []
        for index, (session, _, every) in enumerate(requests):
            start = offsets[index]
            if start >= len(tokens[index]):
                continue
            chunk = tokens[index][start : start + session.chunk]
            last = start + len(chunk) >= len(tokens[index])
            want = "all" if every else ("last" if last else "none")
            items.append((index, session, chunk, want))
            offsets[index] = start + len(chunk)
        if not items:
            break
        for (index, _, _, _), logits in zip(items, chunk_pass(model, items), strict=True):
            if logits is not None:
                outputs[index].append(logits)
    results = []
    for (_, _, every), parts in zip(requests, outputs, strict=True):
        logits = np.concatenate(parts) if len(parts) > 1 else parts[0]
        results.append(logits if every else logits[-1])
    return results


def chunk_pass(model: V3Model, items: list[tuple], collect=None) -> list[np.ndarray | None]:
    """One stacked pass over (index, session, tokens, want) chunks of distinct sessions:
    want "all" -> logits of every row, "last" -> of the last row, "none" -> None. `collect`
    (one item only): receives the chunk's intermediates for a trace (session.py).

    With the native library the engram sites, every block and the read-out are one C call
    each (`native_block`); without it the numpy reference runs block by block."""
    cfg, weights, quantized = model.config, model.weights, model.quantized
    d, lanes_n = cfg.d_model, cfg.mhc_lanes
    plan = native_plan(model)
    rows, starts = [], []
    first = 0
    for _, session, tokens, _ in items:
        session.consumed()
        if session.pending:
            session._flush_pool()
        rows.append(slice(first, first + len(tokens)))
        starts.append(session.position)
        first += len(tokens)
    every = np.concatenate([item[2] for item in items]) if len(items) > 1 else items[0][2]
    emb = weights.embedding_rows(every)  # row by row: the same floats for any stacking
    x0_all = emb * np.sqrt(F32(d))
    engrams, sites = None, None
    if plan is not None and plan.native_engram and collect is None:
        sites = plan.engram([(rows[i].start, len(item[2]), starts[i], item[1].tokens, item[2],
                              item[1].engram_values.values) for i, item in enumerate(items)],
                            first)
    else:  # by position from the session's history: rewindable
        engrams = [EngramChunk(cfg, weights.engram, tokens, starts[i],
                               session.engram_values.tail(session.tokens), quantized,
                               keep=collect is not None)
                   for i, (_, session, tokens, _) in enumerate(items)]
    lanes = np.repeat(x0_all[:, None, :], lanes_n, axis=1)
    pooled = [i for i, (_, session, _, _) in enumerate(items) if session.cells is not None]
    keep_cells = pooled or collect is not None
    cells = np.empty((first, len(weights.layers) + 1, d), F32) if keep_cells else None
    if cells is not None:
        cells[:, 0] = x0_all
    if plan is not None:  # every block in one native call (np_v3_block.h), the same bits
        if sites is None:
            sites = {site: _stacked([e.site(site) for e in engrams])
                     for site in range(len(weights.engram))}
        c_parts = [(rows[i].start, len(item[2]), starts[i], session_pointers(item[1]))
                   for i, item in enumerate(items)]
        plan.blocks(0, len(weights.layers), lanes, c_parts, sites, cells)
    else:
        frames = [ChunkFrame.build(model.step_plan, starts[i], len(item[2]))
                  for i, item in enumerate(items)]
        for index, layer in enumerate(weights.layers):
            parts = [(rows[i], item[1].caches[index], frames[i]) for i, item in enumerate(items)]
            site_kv = None
            if layer.engram_site is not None:
                site_kv = _stacked([e.site(layer.engram_site) for e in engrams])
            lanes = run_block(model, index, lanes, parts, site_kv)
            if cells is not None:
                cell_row(lanes, quantized, out=cells[:, index + 1])
    for i, (_, session, tokens, _) in enumerate(items):
        if engrams is not None:
            for site, raw in engrams[i].raw_values.items():
                session.engram_values.record(site, starts[i], raw)
        if session.cells is not None:
            session.cells.append(cells[rows[i]])
        session.tokens = np.concatenate([session.tokens, tokens])
    wanted = [(i, rows[i] if want == "all" else slice(rows[i].stop - 1, rows[i].stop))
              for i, (_, _, _, want) in enumerate(items) if want != "none"]
    out: list[np.ndarray | None] = [None] * len(items)
    if collect is not None:
        _collect(collect, items[0][2], emb, x0_all, engrams[0], cells,
                 zc_norm(cell_row(lanes, quantized), weights.final_norm))
    if not wanted:
        return out
    picked = np.concatenate([np.arange(s.start, s.stop) for _, s in wanted])
    if plan is not None:
        logits = plan.readout(lanes, picked)
    else:
        hidden = zc_norm(cell_row(lanes[picked], quantized), weights.final_norm)
        logits = product(hidden, weights.lm_head)
    if collect is not None:
        collect("logits", logits)
    at = 0
    for i, s in wanted:
        size = s.stop - s.start
        out[i] = logits[at : at + size]
        at += size
    return out


def _stacked(per: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One site's (keys, values) of several chunks, stacked by rows."""
    if len(per) == 1:
        return per[0]
    return np.concatenate([k for k, _ in per]), np.concatenate([v for _, v in per])


def _collect(collect, tokens, emb, x0, engram: EngramChunk, cells, hidden) -> None:
    """A trace's intermediates of one chunk (names as the fixtures' arrays)."""
    d = x0.shape[1]
    collect("tokens", tokens)
    collect("emb_row", emb)
    collect("emb_row_scaled", x0)
    collect("engram_idx", engram.idx)
    empty = np.zeros((0, len(tokens), d), F32)
    keys, values = engram.keys, engram.values
    collect("engram_k", np.stack(keys) if keys else empty, axis=1)
    collect("engram_v", np.stack(values) if values else empty, axis=1)
    collect("cells", cells)
    collect("final_hidden", hidden)
