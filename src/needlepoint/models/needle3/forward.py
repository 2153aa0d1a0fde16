"""The one batch forward of Needle 3: chunks of one or several sequences,
stacked by rows, through the embedding and engram lookups (`embed`), every block
(`block.run_blocks`) and the read-out (`readout`). Sessions (`V3Session.prefill/step/extend`),
`V3Model.forward`, `run_batch` and the layer-range interface of a staged model
(`layer_range.V3Part`, which calls `embed`, `run_blocks` and `readout` on their own) all run
this code.

An `Item` is one sequence's chunk and the state it reads and advances, handed over by its
owner (a session, or a stage's per-sequence state): the caches of each block, the engram
state (`engram_history`), the confidence cells. The forward advances those objects and
nothing else; the owner keeps its tokens. In deploy numerics every row is computed on its
own, so a sequence's logits are the same bits alone or stacked with others (docs/numerics.md);
float numerics run each item on its own (BLAS results depend on the number of rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..chunking import chunks
from .block import SiteKV, run_blocks
from .engram import EngramChunk
from .native_block import cache_pointers
from .norms import zc_norm
from .protocol import BlockModel

F32 = np.float32
Collect = Callable[..., None]


@dataclass
class Item:
    """One sequence's chunk: `tokens` at positions `len(consumed) ..`, the logits wanted
    ("all", "last" or "none"), and the sequence's state the forward advances."""

    tokens: np.ndarray  # int64, the chunk
    consumed: np.ndarray  # int64, every token of the sequence before the chunk
    caches: Sequence[Any]  # the sequence's cache of each block
    engram: Any  # `EngramHistory` (deploy) or `EngramCarry` (float)
    cells: Any = None  # `CellHistory` (deploy), `PooledCells` (float) or None
    want: str = "none"

    @property
    def start(self) -> int:
        return len(self.consumed)


class StackedSites:
    """Each engram site's key and tapped value for the stacked rows of several chunks,
    computed when a block first asks (one site's pair alive at a time; README step 2)."""

    def __init__(self, engrams: Sequence[EngramChunk]) -> None:
        self.engrams = engrams

    def __getitem__(self, site: int) -> SiteKV:
        per = [engram.site(site) for engram in self.engrams]
        if len(per) == 1:
            return per[0]
        return np.concatenate([k for k, _ in per]), np.concatenate([v for _, v in per])


@dataclass
class Embedding:
    """The rows entering block 0: scaled embedding rows x0 [R, d], each site's (key, tapped
    value), and the raw rows and engram chunks a trace reports."""

    x0: np.ndarray
    sites: Any  # site index -> SiteKV (a dict, or `StackedSites`)
    emb: np.ndarray
    engrams: list[EngramChunk] | None = field(default=None)


def embed(model: BlockModel, items: Sequence[Item], keep: bool = False) -> Embedding:
    """README steps 1-2 for the stacked chunks of `items`: `x0 = E[tok] * sqrt(d)` and the
    engram lookups, by the native step when the plan has them (deploy; the values recorded in
    each item's engram ring by the C code), else `engram.EngramChunk` (recorded by
    `record_engrams` once every block has asked; `keep`: kept for a trace)."""
    cfg, weights, num = model.config, model.weights, model.num
    tokens = np.concatenate([item.tokens for item in items]) if len(items) > 1 \
        else items[0].tokens
    emb = weights.embedding_rows(tokens)  # row by row: the same floats for any stacking
    x0 = emb * np.sqrt(F32(cfg.d_model))
    plan = num.native_plan(model)
    if plan is not None and plan.native_engram and not keep:
        parts, first = [], 0
        for item in items:
            parts.append((first, len(item.tokens), item.start, item.consumed, item.tokens,
                          item.engram.values))
            first += len(item.tokens)
        return Embedding(x0, plan.engram(parts, first), emb)
    engrams = [EngramChunk(cfg, weights.engram, item.tokens, item.start,
                           item.engram.tail(item.consumed), num.product, keep=keep)
               for item in items]
    return Embedding(x0, StackedSites(engrams), emb, engrams)


def record_engrams(items: Sequence[Item], embedded: Embedding) -> None:
    """Each item's engram state takes what its chunk computed (after every site was read)."""
    if embedded.engrams is not None:
        for item, engram in zip(items, embedded.engrams, strict=True):
            item.engram.record_chunk(engram, item.start)


def readout(model: BlockModel, lanes: np.ndarray) -> np.ndarray:
    """Logits of lanes [R, n, d]: the final norm of the lane mean, then the LM head (the
    native read-out in deploy numerics when the plan is built: the same operations)."""
    weights, num = model.weights, model.num
    plan = num.native_plan(model)
    if plan is not None and plan.vocab_out:
        return plan.readout(lanes, np.arange(lanes.shape[0]))
    hidden = zc_norm(num.final_mean(lanes), weights.final_norm)
    return num.lm_head(hidden, weights.lm_head)


def cell_handover(parts: Sequence[tuple[slice, Any]]
                  ) -> tuple[list[tuple[slice, Any]], list[tuple[slice, Any]]]:
    """(streamed, held) of the (rows, cell state) pairs that have a cell state: a streaming
    state takes a chunk's cells block by block (no [C, L+1, d] array); a one-position chunk
    (a decode step), and every state that does not stream, gets its cells at once after the
    blocks: one pooling update per step, not one per block, and the same bits
    (`heads.update`)."""
    streamed, held = [], []
    for rows, cells in parts:
        if cells is not None:
            one_row = rows.stop - rows.start == 1
            (streamed if cells.streaming and not one_row else held).append((rows, cells))
    return streamed, held


def forward(model: BlockModel, items: Sequence[Item], collect: Collect | None = None
            ) -> list[np.ndarray | None]:
    """Logits per item (every row of its chunk for "all", its last row for "last", None for
    "none"), advancing each item's state. `collect` (one item only) receives the chunk's
    intermediates for a trace, named as the fixtures' arrays."""
    num = model.num
    if len(items) > 1 and not num.stacks:
        return [forward(model, [item])[0] for item in items]
    plan = num.native_plan(model)
    if (collect is None and plan is not None and plan.whole_step
            and not any(item.cells is not None and item.cells.streaming for item in items)):
        return native_forward(model, plan, items)
    weights, cfg = model.weights, model.config
    embedded = embed(model, items, keep=collect is not None)
    rows, first = [], 0
    for item in items:
        rows.append(slice(first, first + len(item.tokens)))
        first += len(item.tokens)
    x0 = embedded.x0
    lanes = np.repeat(x0[:, None, :], cfg.mhc_lanes, axis=1)
    streams, held = cell_handover([(r, item.cells) for r, item in zip(rows, items, strict=True)])
    cells = None
    if held or collect is not None:
        cells = np.empty((first, len(weights.layers) + 1, cfg.d_model), F32)
        cells[:, 0] = x0
    for r, state in streams:
        state.add(0, x0[r][:, None, :])
    parts = [(r, item.caches, item.start) for r, item in zip(rows, items, strict=True)]
    lanes = run_blocks(model, 0, len(weights.layers), lanes, parts, embedded.sites, cells, 1,
                       streams)
    record_engrams(items, embedded)
    for r, state in held:
        state.add(0, cells[r])
    if collect is not None:
        _collect(collect, items[0].tokens, embedded, cells,
                 zc_norm(num.final_mean(lanes), weights.final_norm))
    wanted = [(i, r if item.want == "all" else slice(r.stop - 1, r.stop))
              for i, (r, item) in enumerate(zip(rows, items, strict=True)) if item.want != "none"]
    out: list[np.ndarray | None] = [None] * len(items)
    if not wanted:
        return out
    if len(wanted) == 1 and wanted[0][1] == slice(0, first):
        picked = lanes
    else:
        picked = lanes[np.concatenate([np.arange(s.start, s.stop) for _, s in wanted])]
    logits = readout(model, picked)
    if collect is not None:
        collect("logits", logits)
    at = 0
    for i, s in wanted:
        out[i] = logits[at : at + s.stop - s.start]
        at += s.stop - s.start
    return out


def native_forward(model: BlockModel, plan: Any, items: Sequence[Item]
                   ) -> list[np.ndarray | None]:
    """`forward` in one native call (`NativePlan.step`: embedding rows, engram sites, every
    block, the wanted LM-head rows; deploy numerics, no trace): the same operations, the same
    bits, without the Python between them."""
    cfg, weights = model.config, model.weights
    tokens = np.concatenate([item.tokens for item in items]) if len(items) > 1 \
        else items[0].tokens
    x0 = None
    if not plan.native_embed:
        x0 = weights.embedding_rows(tokens) * np.sqrt(F32(cfg.d_model))
    parts, wanted, first = [], [], 0
    held = [item for item in items if item.cells is not None]
    for item in items:
        count = len(item.tokens)
        parts.append((first, count, item.start, cache_pointers(item.caches), item.consumed,
                      item.tokens, item.engram.values))
        if item.want != "none":
            wanted.append(range(first, first + count) if item.want == "all"
                          else range(first + count - 1, first + count))
        first += count
    cells = np.empty((first, len(weights.layers) + 1, cfg.d_model), F32) if held else None
    out_rows = np.fromiter((r for rows in wanted for r in rows), np.int64)
    logits = plan.step(tokens, x0, parts, cells, out_rows)
    out: list[np.ndarray | None] = [None] * len(items)
    at, first = 0, 0
    for i, item in enumerate(items):
        count = len(item.tokens)
        if item.cells is not None:
            item.cells.add(0, cells[first : first + count])
        if item.want != "none":
            take = count if item.want == "all" else 1
            out[i] = logits[at : at + take]
            at += take
        first += count
    return out


def run_chunks(model: BlockModel, tokens: np.ndarray, consumed: np.ndarray, caches: Sequence,
               engram: Any, cells: Any, size: int, want: str, collect: Collect | None = None
               ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """One sequence's `tokens` (after `consumed`) in chunks of `size` (`models.chunking`),
    advancing its caches, engram state and cells: yields each chunk once it has run, with
    its logits (every row for "all", the request's last row for "last", else None)."""
    for part in chunks(len(tokens), size, want):
        chunk = tokens[part.first : part.end]
        logits = forward(model, [Item(chunk, consumed, caches, engram, cells, part.rows)],
                         collect)[0]
        consumed = np.concatenate([consumed, chunk])
        yield chunk, logits


def joined(outputs: Sequence[np.ndarray]) -> np.ndarray | None:
    """The logits of several chunks as one array (None when there are none)."""
    if not outputs:
        return None
    return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]


class Collector:
    """Gathers a trace's per-chunk intermediates and reports each once, concatenated over
    positions (`emit`)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[tuple[np.ndarray, int]]] = {}

    def __call__(self, name: str, value: np.ndarray, axis: int = 0) -> None:
        self.parts.setdefault(name, []).append((np.array(value, copy=True), axis))

    def emit(self, trace: Callable[[str, np.ndarray], None]) -> None:
        for name, parts in self.parts.items():
            axis = parts[0][1]
            trace(name, np.concatenate([value for value, _ in parts], axis=axis))


def _collect(collect: Collect, tokens: np.ndarray, embedded: Embedding,
             cells: np.ndarray, hidden: np.ndarray) -> None:
    """A trace's intermediates of one chunk (names as the fixtures' arrays)."""
    x0, engram = embedded.x0, embedded.engrams[0]
    d = x0.shape[1]
    collect("tokens", tokens)
    collect("emb_row", embedded.emb)
    collect("emb_row_scaled", x0)
    collect("engram_idx", engram.idx)
    empty = np.zeros((0, len(tokens), d), F32)
    keys, values = engram.keys, engram.values
    collect("engram_k", np.stack(keys) if keys else empty, axis=1)
    collect("engram_v", np.stack(values) if values else empty, axis=1)
    collect("cells", cells)
    collect("final_hidden", hidden)
