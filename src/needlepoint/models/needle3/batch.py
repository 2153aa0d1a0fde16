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


def chunk_pass(model: V3Model, items: list[tuple]) -> list[np.ndarray | None]:
    """One stacked pass over (index, session, tokens, want) chunks of distinct sessions:
    want "all" -> logits of every row, "last" -> of the last row, "none" -> None."""
    cfg, weights, quantized = model.config, model.weights, model.quantized
    d, lanes_n = cfg.d_model, cfg.mhc_lanes
    head = weights.confidence
    rows, chunks, frames, starts = [], [], [], []
    first = 0
    for _, session, tokens, _ in items:
        session.consumed()
        if session.pending:
            session._flush_pool()
        start, count = session.position, len(tokens)
        x0 = weights.embedding_rows(tokens) * np.sqrt(F32(d))
        engram = EngramChunk(cfg, weights.engram, tokens, start, session.engram_tail, quantized)
        session.engram_tail = engram.tail
        if session.pool is not None:
            session.pool.update(head, x0[:, None, :], 0)
        rows.append(slice(first, first + count))
        chunks.append((x0, engram))
        frames.append(ChunkFrame.build(model.step_plan, start, count))
        starts.append(start)
        first += count
    x0_all = np.concatenate([x0 for x0, _ in chunks]) if len(chunks) > 1 else chunks[0][0]
    lanes = np.repeat(x0_all[:, None, :], lanes_n, axis=1)
    pooled = [i for i, (_, session, _, _) in enumerate(items) if session.pool is not None]
    for index, layer in enumerate(weights.layers):
        parts = [(rows[i], item[1].caches[index], frames[i]) for i, item in enumerate(items)]
        site_kv = None
        if layer.engram_site is not None:
            per = [engram.site(layer.engram_site) for _, engram in chunks]
            site_kv = per[0] if len(per) == 1 else (
                np.concatenate([k for k, _ in per]), np.concatenate([v for _, v in per]))
        lanes = run_block(model, index, lanes, parts, site_kv)
        if pooled:
            cells = cell_row(lanes, quantized)
            for i in pooled:
                items[i][1].pool.update(head, cells[rows[i]][:, None, :], index + 1)
    for (_, session, tokens, _) in items:
        session.tokens = np.concatenate([session.tokens, tokens])
    wanted = [(i, rows[i] if want == "all" else slice(rows[i].stop - 1, rows[i].stop))
              for i, (_, _, _, want) in enumerate(items) if want != "none"]
    out: list[np.ndarray | None] = [None] * len(items)
    if not wanted:
        return out
    picked = np.concatenate([np.arange(s.start, s.stop) for _, s in wanted])
    hidden = zc_norm(cell_row(lanes[picked], quantized), weights.final_norm)
    logits = product(hidden, weights.lm_head)
    at = 0
    for i, s in wanted:
        size = s.stop - s.start
        out[i] = logits[at : at + size]
        at += size
    return out
