"""Needle 3 as a layer range (`models.layer_range.LayerRange`): the part of a model a head or
a stage holds, and the three pieces of seed 003.

* `embed` (head): the scaled embedding rows x0 and each engram site's key and tapped value,
  keyed by the block that reads them, as the single-process chunk pass computes them
  (`batch.chunk_pass`: deploy numerics keep the engram values by position, so a rewind can go
  back; float numerics carry the engram tail as `V3Session` does). x0 also feeds confidence
  row 0.
* `run_layers` (any stage): the lanes through `block.run_block` for each block of a
  contiguous range, with that range's own caches; block 0 builds the lanes from x0 as the
  single-process pass does. The lane means after each block feed that range's confidence
  rows.
* `final_rows` (last stage): the lane means of the rows to read out; `readout` (head): the
  final norm, then the LM head.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cached_property
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...errors import NonFiniteActivationError
from ...formats.cact import CactArchive, open_archive
from ...formats.chat_format import NeedleFormat
from ...formats.needle3_geometry import V3Config
from ..layer_range import Embedded
from ..ops import rope_tables, rope_tables_pinned
from ..token_ids import check_token_ids
from .attention import ChunkFrame
from .block import cell_row, run_block
from .cache import LayerCache
from .cell_history import CellHistory
from .engram import EngramChunk, new_tail
from .engram_history import EngramHistory
from .exact_attention import MAX_REWIND, Int8LayerCache
from .exact_ops import product
from .heads import ConfidencePool
from .norms import zc_norm
from .parts import head_weights, layer_bytes, rung, stage_weights
from .session import CHUNK, bounded_window
from .step import StepPlan, build_plan
from .weights import V3Weights, rotate

F32 = np.float32


class V3HeadState:
    """Per sequence on the head: tokens, engram history (deploy) or tail (float), row 0."""

    def __init__(self, part: V3Part) -> None:
        cfg, weights = part.config, part.weights
        self.tokens = np.zeros(0, np.int64)
        sites = len(weights.engram)
        self.history = EngramHistory(cfg, sites, MAX_REWIND) if part.quantized else None
        self.tail = None if part.quantized else new_tail(cfg, sites)
        head = weights.confidence
        self.cells = CellHistory(head, MAX_REWIND, 0, 1) if head is not None and \
            part.quantized else None
        self.pool = ConfidencePool.empty(head) if head is not None and not part.quantized \
            else None

    def copy(self) -> V3HeadState:
        other = V3HeadState.__new__(V3HeadState)
        other.tokens = self.tokens.copy()
        other.history = None if self.history is None else self.history.copy()
        other.tail = None if self.tail is None else self.tail.copy()
        other.cells = None if self.cells is None else self.cells.copy()
        other.pool = None if self.pool is None else self.pool.copy()
        return other

    def rewind_to(self, position: int) -> None:
        if self.history is None:
            raise ValueError("float numerics cannot rewind in place (re-run the tokens)")
        if self.cells is not None:
            self.cells.rewind(len(self.tokens) - position)
        self.tokens = self.tokens[:position].copy()


class V3RangeState:
    """Per sequence on a stage: its blocks' caches and its confidence rows."""

    def __init__(self, caches: dict, cells: CellHistory | None,
                 pool: ConfidencePool | None) -> None:
        self.caches, self.cells, self.pool = caches, cells, pool

    def copy(self) -> V3RangeState:
        return V3RangeState({i: c.copy() for i, c in self.caches.items()},
                            None if self.cells is None else self.cells.copy(),
                            None if self.pool is None else self.pool.copy())

    def rewind_to(self, position: int) -> None:
        for cache in self.caches.values():
            if not hasattr(cache, "rewind_to"):
                raise ValueError("float numerics cannot rewind in place (re-run the tokens)")
            back = cache.position - position
            cache.rewind_to(position)
        if self.cells is not None and self.caches:
            self.cells.rewind(back)


class V3Part:
    """Blocks `blocks` of a Needle 3 rung, and (with `head`) the embedding, engram sites,
    final norm, LM head and confidence head. What `run_block` reads is here (config,
    weights.layers[index], step_plan.layers[index], hada permutations, numerics)."""

    max_rewind = MAX_REWIND
    chunk = CHUNK  # positions per prefill chunk, as a single-process session

    def __init__(self, archive: CactArchive, config: V3Config, weights: V3Weights,
                 kept: tuple[int, ...], numerics: str, blocks: range, threads: int = 1) -> None:
        self.archive, self.config, self.weights = archive, config, weights
        self.layer_indices, self.numerics = kept, numerics
        self.quantized = numerics == "deploy"
        self.blocks, self.threads = blocks, threads
        self.stacks = self.quantized  # run_layers_batch stacks a micro-batch in one pass
        if len(blocks):
            tables = rope_tables_pinned if self.quantized else rope_tables
            self.rope_cos, self.rope_sin = tables(np.arange(config.max_seq_len),
                                                  config.qk_head_dim, config.rope_theta)
        # engram site -> the block that reads it (the rung's numbering)
        self.site_block = dict(enumerate(config.engram_sites))

    @classmethod
    def load(cls, path: Any, *, blocks: tuple[int, int] | None = None, head: bool = False,
             layers: int | None = None, numerics: str = "deploy", threads: int = 1,
             cache: bool | None = None) -> V3Part:
        archive = open_archive(path)
        kept, cfg = rung(archive, layers)
        if head:
            weights = head_weights(archive, cfg, kept, numerics, threads, cache)
            span = range(0)
        else:
            first, end = blocks
            weights = stage_weights(archive, cfg, kept, first, end, numerics, threads, cache)
            span = range(first, end)
        return cls(archive, cfg, weights, kept, numerics, span, threads)

    def block_bytes(self) -> list[int]:
        """Archive bytes each block of the rung reads (a plan balances these)."""
        return layer_bytes(self.archive, self.layer_indices)

    @property
    def has_confidence_head(self) -> bool:
        return self.weights.confidence is not None

    @cached_property
    def tokenizer(self) -> Any:
        return self.archive.tokenizer

    @property
    def chat_format(self) -> NeedleFormat:
        """Needle's wire format (`formats/chat_format.py`), as the whole model's."""
        return NeedleFormat(self.tokenizer)

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        return check_token_ids(ids, self.config.vocab, self.config.max_seq_len, position)

    @cached_property
    def step_plan(self) -> StepPlan:
        """`build_plan` of the whole model restricted to this part's blocks (its entries are
        built by the same code from the same weights; the others are None)."""
        first, end = self.blocks.start, self.blocks.stop
        own = self.weights.layers[first:end]
        shim = SimpleNamespace(config=self.config, weights=SimpleNamespace(layers=own),
                               rope_cos=self.rope_cos, rope_sin=self.rope_sin)
        dense = build_plan(shim)
        total = len(self.weights.layers)
        padded = (None,) * first + dense.layers + (None,) * (total - end)
        return dataclasses.replace(dense, layers=padded)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the products this part's blocks read (packed CQ rows or float matrices)."""
        total = 0
        for layer in self.weights.layers[self.blocks.start : self.blocks.stop]:
            for matrix in (layer.qkvg, layer.out_proj, layer.mhc.phi):
                parts = matrix if isinstance(matrix, list) else [matrix]
                total += sum(int(getattr(p, "nbytes", 0)) for p in parts)
        return total

    # -- the head -----------------------------------------------------------------------------
    def head_state(self) -> V3HeadState:
        return V3HeadState(self)

    def embed(self, state: V3HeadState, tokens: np.ndarray, start: int) -> Embedded:
        cfg, weights = self.config, self.weights
        x0 = weights.embedding_rows(tokens) * np.sqrt(F32(cfg.d_model))
        tail = state.history.tail(state.tokens) if state.history is not None else state.tail
        engram = EngramChunk(cfg, weights.engram, tokens, start, tail, self.quantized)
        side = {self.site_block[s]: engram.site(s) for s in range(len(weights.engram))}
        if state.history is not None:
            for site, raw in engram.raw_values.items():
                state.history.record(site, start, raw)
        else:
            state.tail = engram.tail
        if state.cells is not None:
            state.cells.append(x0[:, None, :])
        elif state.pool is not None:
            state.pool.update(weights.confidence, x0[:, None, :], 0)
        state.tokens = np.concatenate([state.tokens, tokens])
        return Embedded(x0, side)

    def readout(self, rows: np.ndarray) -> np.ndarray:
        hidden = zc_norm(rows, self.weights.final_norm)
        if self.quantized:  # the exact A8 product with the tied embedding rows
            return product(hidden, self.weights.lm_head)
        return rotate(hidden) @ self.weights.lm_head  # rotated domain (weights.py)

    def confidence_logit(self, state: V3HeadState, rows: Sequence[tuple[int, Any]]) -> float:
        """The logit from row 0 (here) and each stage's (first block, pool rows)."""
        pool = state.cells.folded() if state.cells is not None else state.pool.copy()
        for first, (peak, total, pooled) in rows:
            cells = slice(first + 1, first + 1 + len(peak))
            pool.peak[cells], pool.total[cells], pool.pooled[cells] = peak, total, pooled
        return pool.logit(self.weights.confidence)

    def window_cuts(self, kv_window: int | None, position: int) -> bool:
        """Whether `kv_window` has cut some layer's attention by `position` (the confidence
        cells then differ from full-causal ones)."""
        for layer in range(self.config.num_layers):
            window = self.config.layer_window(layer)
            if bounded_window(window, kv_window) != window and \
                    position > bounded_window(window, kv_window):
                return True
        return False

    # -- a stage ------------------------------------------------------------------------------
    def range_state(self, kv_window: int | None = None) -> V3RangeState:
        cfg, weights = self.config, self.weights
        conv_rows = max(0, cfg.qkv_conv_taps - 1)
        conv_width = (cfg.num_heads + cfg.num_kv_heads) * cfg.qk_head_dim
        conv_width += cfg.num_kv_heads * cfg.v_head_dim
        cache_type = Int8LayerCache if self.quantized else LayerCache
        caches = {
            index: cache_type(
                bounded_window(weights.layers[index].window, kv_window),
                cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim, conv_rows, conv_width,
                cfg.max_seq_len,
            )
            for index in self.blocks
        }
        head = weights.confidence
        cells = pool = None
        if head is not None and self.quantized:
            cells = CellHistory(head, MAX_REWIND, self.blocks.start + 1, len(self.blocks))
        elif head is not None:
            pool = ConfidencePool.empty(head)
        return V3RangeState(caches, cells, pool)

    def run_layers(self, first: int, end: int, x: np.ndarray, state: V3RangeState,
                   start: int, side: Mapping[int, tuple[np.ndarray, ...]] | None = None
                   ) -> np.ndarray:
        side = side or {}
        count = x.shape[0]
        lanes = np.repeat(x[:, None, :], self.config.mhc_lanes, axis=1) if first == 0 else x
        frame = ChunkFrame.build(self.step_plan, start, count)
        head = self.weights.confidence
        cells = np.empty((count, end - first, x.shape[-1]), F32) \
            if state.cells is not None else None
        for index in range(first, end):
            try:
                lanes = run_block(self, index, lanes, [(slice(None), state.caches[index], frame)],
                                  side.get(index))
            except NonFiniteActivationError as error:
                raise type(error)(f"layer {index}: {error}") from None
            if cells is not None:
                cell_row(lanes, self.quantized, out=cells[:, index - first])
            elif state.pool is not None:
                state.pool.update(head, cell_row(lanes, self.quantized)[:, None, :], index + 1)
        if cells is not None:
            state.cells.append(cells)
        return lanes

    def run_layers_batch(self, first: int, end: int, xs: Sequence[np.ndarray],
                         states: Sequence[V3RangeState], starts: Sequence[int],
                         sides: Sequence[Mapping[int, tuple[np.ndarray, ...]]]
                         ) -> list[np.ndarray]:
        """`run_layers` for chunks of several sequences at once: deploy numerics run one
        stacked pass (each block's products read its weights once for every row; each
        sequence attends its own cache), whose rows are the same bits as alone (batch
        invariance, docs/numerics.md); float numerics run each chunk on its own."""
        if not self.quantized or len(xs) == 1:
            return [self.run_layers(first, end, x, state, start, side)
                    for x, state, start, side in zip(xs, states, starts, sides, strict=True)]
        rows, at = [], 0
        for x in xs:
            rows.append(slice(at, at + x.shape[0]))
            at += x.shape[0]
        lanes = np.concatenate(xs)
        if first == 0:
            lanes = np.repeat(lanes[:, None, :], self.config.mhc_lanes, axis=1)
        frames = [ChunkFrame.build(self.step_plan, start, x.shape[0])
                  for x, start in zip(xs, starts, strict=True)]
        keep = [state.cells is not None for state in states]
        cells = np.empty((at, end - first, lanes.shape[-1]), F32) if any(keep) else None
        for index in range(first, end):
            parts = [(r, state.caches[index], frame)
                     for r, state, frame in zip(rows, states, frames, strict=True)]
            kv = None
            if index in sides[0]:
                kv = tuple(np.concatenate([side[index][j] for side in sides]) for j in range(2))
            try:
                lanes = run_block(self, index, lanes, parts, kv)
            except NonFiniteActivationError as error:
                raise type(error)(f"layer {index}: {error}") from None
            if cells is not None:
                cell_row(lanes, True, out=cells[:, index - first])
        for r, state, kept in zip(rows, states, keep, strict=True):
            if kept:
                state.cells.append(cells[r])
        return [lanes[r] for r in rows]

    def final_rows(self, x: np.ndarray, want: str) -> np.ndarray:
        rows = x if want == "all" else x[-1:]
        return cell_row(rows, True) if self.quantized else rows.mean(axis=1)

    def confidence_rows(self, state: V3RangeState):
        """(peak, total, pooled) of this part's confidence rows (None without the head)."""
        pool = state.cells.folded() if state.cells is not None else state.pool
        if pool is None:
            return None
        rows = slice(self.blocks.start + 1, self.blocks.stop + 1)
        return pool.peak[rows].copy(), pool.total[rows].copy(), pool.pooled[rows].copy()


__all__ = ["V3HeadState", "V3Part", "V3RangeState"]
