"""Needle 3 as a layer range (`models.layer_range.LayerRange`): the part of a model a head or
a stage holds, and the three pieces of seed 003.

Each piece is a piece of the one batch forward (`forward.py`, `block.run_blocks`), so a model
cut into stages computes what one process computes:

* `embed` (head): `forward.embed` of the chunk (the scaled embedding rows x0 and each engram
  site's key and tapped value, keyed by the block that reads them; the sequence's engram
  state as its numerics keep it). x0 also feeds confidence row 0.
* `run_layers` / `run_layers_batch` (any stage): `block.run_blocks` over a contiguous range
  for one or several sequences' chunks, one block at a time (so an error names its layer),
  with that range's own caches; block 0 builds the lanes from x0 as the single-process pass
  does. The lane means after each block feed that range's confidence rows.
* `final_rows` (last stage): the lane means of the rows to read out; `readout` (head): the
  final norm, then the LM head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from ...errors import NonFiniteActivationError
from ...formats.cact import CactArchive, open_archive
from ...formats.needle3_geometry import V3Config
from ..layer_range import Embedded
from ..token_ids import check_token_ids
from ..wrapping import NeedleArchiveText
from .block import run_blocks
from .cache import bounded_window, new_caches
from .exact_attention import MAX_REWIND
from .forward import Item, cell_handover, embed, record_engrams
from .norms import zc_norm
from .numerics import numerics as make_numerics
from .parts import head_weights, layer_bytes, rung, stage_weights
from .session import CHUNK
from .step import StepPlan, build_plan
from .weights import V3Weights

F32 = np.float32


class V3HeadState:
    """Per sequence on the head: tokens, engram state and confidence row 0, of the kinds the
    part's numerics make."""

    def __init__(self, part: V3Part) -> None:
        cfg, weights, num = part.config, part.weights, part.num
        self.exact = num.exact
        self.tokens = np.zeros(0, np.int64)
        self.engram = num.engram_state(cfg, len(weights.engram))
        self.cells = num.cell_state(weights.confidence, 0, 1)

    def copy(self) -> V3HeadState:
        other = V3HeadState.__new__(V3HeadState)
        other.exact = self.exact
        other.tokens = self.tokens.copy()
        other.engram = self.engram.copy()
        other.cells = None if self.cells is None else self.cells.copy()
        return other

    def rewind_to(self, position: int) -> None:
        if not self.exact:
            raise ValueError("float numerics cannot rewind in place (re-run the tokens)")
        if self.cells is not None:
            self.cells.rewind(len(self.tokens) - position)
        self.tokens = self.tokens[:position].copy()


class V3RangeState:
    """Per sequence on a stage: its blocks' caches and its confidence rows."""

    def __init__(self, caches: dict, cells, exact: bool) -> None:
        self.caches, self.cells = caches, cells  # cells: CellHistory, PooledCells or None
        self.exact = exact  # the numerics keep what an in-place rewind needs (deploy)

    def copy(self) -> V3RangeState:
        return V3RangeState({i: c.copy() for i, c in self.caches.items()},
                            None if self.cells is None else self.cells.copy(), self.exact)

    def rewind_to(self, position: int) -> None:
        """Drop every position from `position` on (deploy numerics; float numerics re-run the
        kept tokens on a fresh state instead)."""
        if not self.exact:
            raise ValueError("float numerics cannot rewind in place (re-run the tokens)")
        back = 0
        for cache in self.caches.values():
            back = cache.position - position
            cache.rewind_to(position)
        if self.cells is not None and back:
            self.cells.rewind(back)


class V3Part(NeedleArchiveText):
    """Blocks `blocks` of a Needle 3 rung, and (with `head`) the embedding, engram sites,
    final norm, LM head and confidence head. What `run_block` reads is here (config,
    weights.layers[index], step_plan.layers[index], hada permutations, numerics)."""

    max_rewind = MAX_REWIND
    chunk = CHUNK  # positions per prefill chunk, as a single-process session
    kv_windows = True  # kv_window= bounds the attention rings (`window_cuts`)

    def __init__(self, archive: CactArchive, config: V3Config, weights: V3Weights,
                 kept: tuple[int, ...], numerics: str, blocks: range, threads: int = 1) -> None:
        super().__init__(archive, config, kept)
        self.weights = weights
        self.num = make_numerics(numerics, threads)  # the numerics strategy (`numerics.py`)
        self.numerics = self.num.name
        self.exact = self.num.exact
        self.blocks, self.threads = blocks, threads
        self.stacks = self.num.stacks  # run_layers_batch stacks a micro-batch in one pass
        if len(blocks):
            self.rope_cos, self.rope_sin = self.num.rope_tables(
                np.arange(config.max_seq_len), config.qk_head_dim, config.rope_theta)
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

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        return check_token_ids(ids, self.config.vocab, self.config.max_seq_len, position)

    @cached_property
    def step_plan(self) -> StepPlan:
        """`build_plan` of the whole model restricted to this part's blocks (its entries are
        built by the same code from the same weights; the others are None)."""
        return build_plan(self.config, self.weights.layers, self.rope_cos, self.rope_sin)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the products this part's blocks read (packed CQ rows or float matrices)."""
        total = 0
        for layer in self.weights.layers[self.blocks.start : self.blocks.stop]:
            for matrix in (layer.qkvg, layer.out_proj, layer.mhc.phi):
                parts = matrix if isinstance(matrix, list) else [matrix]
                total += sum(int(p.nbytes) for p in parts)
        return total

    # -- the head -----------------------------------------------------------------------------
    def head_state(self) -> V3HeadState:
        return V3HeadState(self)

    def embed(self, state: V3HeadState, tokens: np.ndarray, start: int) -> Embedded:
        item = Item(tokens, state.tokens, (), state.engram)
        embedded = embed(self, [item])
        side = {self.site_block[s]: embedded.sites[s] for s in range(len(self.weights.engram))}
        record_engrams([item], embedded)
        if state.cells is not None:
            state.cells.add(0, embedded.x0[:, None, :])
        state.tokens = np.concatenate([state.tokens, tokens])
        return Embedded(embedded.x0, side)

    def readout(self, rows: np.ndarray) -> np.ndarray:
        return self.num.lm_head(zc_norm(rows, self.weights.final_norm), self.weights.lm_head)

    def confidence_logit(self, state: V3HeadState, rows: Sequence[tuple[int, Any]]) -> float:
        """The logit from row 0 (here) and each stage's (first block, pool rows)."""
        pool = state.cells.folded().copy()
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
        windows = [weights.layers[index].window for index in self.blocks]
        caches = dict(zip(self.blocks, new_caches(cfg, self.num.cache_type, windows, kv_window),
                          strict=True))
        cells = self.num.cell_state(weights.confidence, self.blocks.start + 1, len(self.blocks))
        return V3RangeState(caches, cells, self.num.exact)

    def run_layers(self, first: int, end: int, x: np.ndarray, state: V3RangeState,
                   start: int, side: Mapping[int, tuple[np.ndarray, ...]] | None = None
                   ) -> np.ndarray:
        return self.run_layers_batch(first, end, [x], [state], [start], [side or {}])[0]

    def run_layers_batch(self, first: int, end: int, xs: Sequence[np.ndarray],
                         states: Sequence[V3RangeState], starts: Sequence[int],
                         sides: Sequence[Mapping[int, tuple[np.ndarray, ...]]]
                         ) -> list[np.ndarray]:
        """`run_layers` for chunks of several sequences at once: deploy numerics run one
        stacked pass (each block's products read its weights once for every row; each
        sequence attends its own cache), whose rows are the same bits as alone (batch
        invariance, docs/numerics.md); float numerics run each chunk on its own."""
        if len(xs) > 1 and not self.num.stacks:
            return [self.run_layers_batch(first, end, [x], [state], [start], [side])[0]
                    for x, state, start, side in zip(xs, states, starts, sides, strict=True)]
        rows, at = [], 0
        for x in xs:
            rows.append(slice(at, at + x.shape[0]))
            at += x.shape[0]
        lanes = np.concatenate(xs) if len(xs) > 1 else xs[0]
        if first == 0:
            lanes = np.repeat(lanes[:, None, :], self.config.mhc_lanes, axis=1)
        else:  # a fresh C-contiguous array: the forward writes it in place
            lanes = np.array(lanes, F32, order="C")
        sites = {}
        for block, kv in sides[0].items():
            if not first <= block < end:  # the head's side inputs of blocks run elsewhere
                continue
            site = self.weights.layers[block].engram_site
            sites[site] = kv if len(xs) == 1 else \
                tuple(np.concatenate([side[block][j] for side in sides]) for j in range(2))
        streams, held = cell_handover([(r, s.cells) for r, s in zip(rows, states, strict=True)])
        cells = np.empty((at, end - first, lanes.shape[-1]), F32) if held else None
        parts = [(r, state.caches, start) for r, state, start in zip(rows, states, starts,
                                                                     strict=True)]
        for index in range(first, end):  # a block at a time: an error names its layer
            try:
                lanes = run_blocks(self, index, index + 1, lanes, parts, sites, cells,
                                   index - first, streams)
            except NonFiniteActivationError as error:
                raise type(error)(f"layer {index}: {error}") from None
        for r, state in held:  # column c is block first + c's output: cell row first + c + 1
            state.add(first + 1, cells[r])
        return [lanes[r] for r in rows]

    def final_rows(self, x: np.ndarray, want: str) -> np.ndarray:
        return self.num.final_mean(x if want == "all" else x[-1:])

    def confidence_rows(self, state: V3RangeState):
        """(peak, total, pooled) of this part's confidence rows (None without the head)."""
        if state.cells is None:
            return None
        pool = state.cells.folded()
        rows = slice(self.blocks.start + 1, self.blocks.stop + 1)
        return pool.peak[rows].copy(), pool.total[rows].copy(), pool.pooled[rows].copy()


__all__ = ["V3HeadState", "V3Part", "V3RangeState"]
