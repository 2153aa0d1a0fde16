"""One decode state per sequence: caches, engram tail, confidence pool (fixture README step 5).

`prefill` runs the prompt in chunks of `CHUNK` positions through the same code the decode `step`
uses (a step is a chunk of one), so both fill the same caches. Layers attend exactly as
upstream's forward (full causal on global layers, `sliding_window` on the others), or, with
`kv_window=`, every layer is additionally bounded to the last `kv_window` positions (a ring of
that many slots), as the shipped engine does (README `_kvwin` arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ModelInputError
from ..protocol import SessionCapabilities
from .attention import ChunkFrame
from .batch import chunk_pass
from .block import cell_row, run_block
from .cache import LayerCache
from .cell_history import CellHistory
from .engram import EngramChunk, new_tail
from .engram_history import EngramHistory
from .exact_attention import MAX_REWIND, Int8LayerCache
from .heads import ConfidencePool
from .norms import zc_norm
from .step import decode_step
from .weights import rotate

if TYPE_CHECKING:  # pragma: no cover
    from .model import V3Model

F32 = np.float32
# Positions per prefill chunk: larger chunks run the weight GEMMs at a better M (~100 vs
# ~80 GFLOP/s at 64), but every [CHUNK, ...] temporary grows with it and the heap they churn
# through stays resident: 128 costs ~3% of 512-token prefill speed against 256 and ~7 MB
# less peak RSS. A multiple of `attention.ATTN_BLOCK`, so attention blocks fall on the same
# positions whatever the chunk size. The caches left are the same up to float32 rounding:
# only BLAS's choice of kernel for the small-N products (cond_v, phi) depends on the row
# count.
CHUNK = 128
# Decode steps keep their confidence cells and fold them into the pool this many at a time
# (one batched online-softmax update, as a prefill chunk does) or when the logit is asked.
POOL_BATCH = 64
Trace = Callable[[str, np.ndarray], None]


def bounded_window(window: int, kv_window: int | None) -> int:
    """A layer's window (0 = unbounded) once every layer is limited to `kv_window`."""
    if not kv_window:
        return window
    return min(window, kv_window) if window else kv_window


class _Collector:
    """Gathers per-chunk intermediates and reports each once, concatenated over positions."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}

    def __call__(self, name: str, value: np.ndarray, axis: int = 0) -> None:
        self.parts.setdefault(name, []).append((np.array(value, copy=True), axis))

    def emit(self, trace: Trace) -> None:
        for name, parts in self.parts.items():
            axis = parts[0][1]
            trace(name, np.concatenate([value for value, _ in parts], axis=axis))


class V3Session:
    """Incremental decoding state of one sequence; the model's weights are shared read-only."""

    def __init__(
        self, model: V3Model, kv_window: int | None = None, trace: Trace | None = None,
        chunk: int = CHUNK,
    ) -> None:
        cfg = model.config
        if kv_window is not None and kv_window <= 0:
            raise ModelInputError(f"kv_window must be positive, got {kv_window}")
        if not isinstance(chunk, int) or chunk <= 0:
            raise ModelInputError(f"chunk must be a positive int, got {chunk!r}")
        self.chunk = chunk
        self.model = model
        self.kv_window = kv_window
        self.trace = trace
        weights = model.weights
        conv_rows = max(0, cfg.qkv_conv_taps - 1)
        conv_width = (cfg.num_heads + cfg.num_kv_heads) * cfg.qk_head_dim
        conv_width += cfg.num_kv_heads * cfg.v_head_dim
        cache_type = Int8LayerCache if model.quantized else LayerCache
        self.caches = [
            cache_type(
                bounded_window(layer.window, kv_window), cfg.num_kv_heads, cfg.qk_head_dim,
                cfg.v_head_dim, conv_rows, conv_width, cfg.max_seq_len,
            )
            for layer in weights.layers
        ]
        self.engram_tail = new_tail(cfg, len(weights.engram))
        head = weights.confidence
        self.pool = ConfidencePool.empty(head) if head is not None else None
        # deploy sessions can rewind (`rewind`): the engram value projections of recent
        # positions, and confidence cells kept unfolded (cell_history.py)
        self.engram_values: EngramHistory | None = None
        self.cells: CellHistory | None = None
        if model.quantized:
            self.engram_values = EngramHistory(cfg, len(weights.engram), MAX_REWIND)
            if head is not None:
                self.cells, self.pool = CellHistory(head, MAX_REWIND), None
        # decode-step cells not yet in the pool: rows [:pending] of one [POOL_BATCH, L+1, d]
        # buffer (allocated on the first step; a list of rows would need a stacked copy)
        self.cell_rows: np.ndarray | None = None
        self.pending = 0
        self.tokens = np.zeros(0, np.int64)
        self._history: list[int] = []  # decode-step tokens not yet appended to `tokens`

    @property
    def capabilities(self) -> SessionCapabilities:
        """`models/protocol.py`: exact extend/rewind in deploy numerics, fork, pooled head."""
        return SessionCapabilities(extend=True, rewind=True, exact=self.model.quantized,
                                   fork=True, confidence=True, chunk=self.chunk)

    @property
    def exact_extend(self) -> bool:
        """`extend` is bit-identical to stepping and `rewind` exact (deploy numerics)."""
        return self.model.quantized

    @property
    def position(self) -> int:
        """Tokens consumed so far (the position the next token takes)."""
        return len(self.tokens) + len(self._history)

    def consumed(self) -> np.ndarray:
        """Every token consumed so far (int64)."""
        if self._history:
            self.tokens = np.concatenate([self.tokens, np.asarray(self._history, np.int64)])
            self._history = []
        return self.tokens

    def push_token(self, token: int) -> None:
        self._history.append(token)

    def pending_cells_row(self, cells: int, width: int) -> np.ndarray | None:
        """A fresh [cells, width] row for a decode step's confidence cells (None: no head)."""
        if self.pool is None:
            return None
        if self.pending >= POOL_BATCH:
            self._flush_pool()
        if self.cell_rows is None:
            self.cell_rows = np.empty((POOL_BATCH, cells, width), F32)
        row = self.cell_rows[self.pending]
        self.pending += 1
        return row

    def _flush_pool(self) -> None:
        if self.pending:
            self.pool.update(self.model.weights.confidence, self.cell_rows[: self.pending])
            self.pending = 0

    def fork(self) -> V3Session:
        """An independent copy of this state (both may continue differently)."""
        other = V3Session.__new__(V3Session)
        other.model, other.kv_window, other.trace = self.model, self.kv_window, self.trace
        other.chunk = self.chunk
        other.caches = [cache.copy() for cache in self.caches]
        other.engram_tail = self.engram_tail.copy()
        other.pool = self.pool.copy() if self.pool is not None else None
        other.engram_values = None if self.engram_values is None else self.engram_values.copy()
        other.cells = None if self.cells is None else self.cells.copy()
        other.cell_rows = None if self.cell_rows is None else self.cell_rows.copy()
        other.pending = self.pending
        other.tokens = self.consumed().copy()
        other._history = []
        return other

    __copy__ = fork

    # -- public steps -------------------------------------------------------------------------
    def prefill(
        self, ids: Sequence[int] | np.ndarray, *, logits: bool = True, trace: Trace | None = None
    ) -> np.ndarray | None:
        """Consume `ids` (appending to anything already consumed). Returns the logits
        [vocab_out] at the last of them, or None (and no LM head at all) with `logits=False`."""
        out = self._run(ids, "last" if logits else "none", trace)
        return None if out is None else out[-1]

    def step(self, token_id: int, *, trace: Trace | None = None) -> np.ndarray:
        """Consume one token; returns the logits [vocab_out] for the next position."""
        return self._run([token_id], "last", trace)[-1]

    def extend(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Consume `ids`; returns the logits [len(ids), vocab_out] after each of them (a
        multi-position step: in deploy numerics bit-identical to stepping them one by one)."""
        return self._run(ids, "all", None)

    def confidence_logit(self) -> float | None:
        """Confidence-head logit over every token consumed so far (None without the head).

        Pooled online from this session's own cells, which equal upstream's full-causal cells
        unless a `kv_window` bound has cut a layer's attention (position > kv_window); in that
        case the head is recomputed from a full-causal pass over the consumed tokens.
        """
        if self.pool is None and self.cells is None:
            return None
        if not self.position:
            raise ModelInputError("confidence_logit: the session has consumed no tokens")
        if self._bounded_differs():
            return self.model.confidence_logit(self.consumed())
        if self.cells is not None:
            return self.cells.logit()
        self._flush_pool()
        return self.pool.logit(self.model.weights.confidence)

    def rewind(self, n: int) -> None:
        """Undo the last `n` positions exactly, as if they had never been consumed: the next
        step or extend gives the same bits as it would have then. Deploy numerics keep what
        this needs for up to MAX_REWIND (64) positions (ring slack, raw conv rows, engram
        values, unfolded confidence cells); float numerics rebuild the state by re-running the
        kept tokens (float rounding may then differ from the original steps')."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ModelInputError(f"rewind needs a count >= 0, got {n!r}")
        n = int(n)
        if n > self.position:
            raise ModelInputError(f"cannot rewind {n} positions: only {self.position} consumed")
        if n == 0:
            return
        kept = self.consumed()[: self.position - n]
        if not self.model.quantized:
            fresh = V3Session(self.model, self.kv_window, self.trace, self.chunk)
            if len(kept):
                fresh.prefill(kept, logits=False)
            self.__dict__.update(fresh.__dict__)
            return
        if n > MAX_REWIND:
            raise ModelInputError(f"cannot rewind {n} positions: at most {MAX_REWIND} are kept")
        self.tokens = kept.copy()
        for cache in self.caches:
            cache.rewind_to(len(kept))
        if self.cells is not None:
            self.cells.rewind(n)

    def _bounded_differs(self) -> bool:
        for cache, layer in zip(self.caches, self.model.weights.layers, strict=True):
            if cache.window != layer.window and self.position > cache.window:
                return True
        return False

    # -- the forward pass ---------------------------------------------------------------------
    def _run(self, ids, want: str, trace: Trace | None) -> np.ndarray | None:
        tokens = self.model.check_ids(ids, self.position)
        trace = trace or self.trace
        collect = _Collector() if trace is not None else None
        # Float numerics step through the folded one-token path (`step.py`); deploy numerics
        # run every position through the chunk path, whose operations are batch-invariant
        # (docs/numerics.md): a step is a chunk of one, with the same bits as in any prefill.
        if len(tokens) == 1 and collect is None and want != "all" and not self.model.quantized:
            return decode_step(self, int(tokens[0]), want == "last")
        self.consumed()
        if self.pending:
            self._flush_pool()
        outputs = []
        size = self.chunk
        for first in range(0, len(tokens), size):
            chunk = tokens[first : first + size]
            last_chunk = first + size >= len(tokens)
            rows = want == "all" or (want == "last" and last_chunk)
            logits = self._chunk(chunk, rows and want, collect)
            if logits is not None:
                outputs.append(logits)
        if collect is not None:
            collect.emit(trace)
        if not outputs:
            return None
        return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]

    def _chunk(self, tokens: np.ndarray, want, collect: _Collector | None) -> np.ndarray | None:
        model = self.model
        if model.quantized:  # the batched pass, with one sequence in it
            return chunk_pass(model, [(0, self, tokens, want or "none")], collect)[0]
        cfg, weights, quantized = model.config, model.weights, False  # float numerics
        start, count = self.position, len(tokens)
        d, lanes_n = cfg.d_model, cfg.mhc_lanes
        emb = weights.embedding_rows(tokens)
        x0 = emb * np.sqrt(F32(d))
        engram = EngramChunk(cfg, weights.engram, tokens, start, self.engram_tail, quantized,
                             keep=collect is not None)
        self.engram_tail = engram.tail
        frame = ChunkFrame.build(model.step_plan, start, count)
        lanes = np.repeat(x0[:, None, :], lanes_n, axis=1)
        # Cell rows (lane means after each block) are folded into the confidence pool as soon
        # as they exist, one row at a time; only a trace keeps all [C, L+1, d] of them.
        head = weights.confidence if self.pool is not None else None
        cells = np.empty((count, len(weights.layers) + 1, d), F32) if collect is not None else None
        mean = np.empty((count, d), F32) if cells is None and head is not None else None
        if cells is not None:
            cells[:, 0] = x0
        if head is not None:
            self.pool.update(head, x0[:, None, :], 0)
        for index, (layer, cache) in enumerate(zip(weights.layers, self.caches, strict=True)):
            site = layer.engram_site
            site_kv = engram.site(site) if site is not None else None
            lanes = run_block(model, index, lanes, [(slice(None), cache, frame)], site_kv)
            if head is not None or cells is not None:
                row = cells[:, index + 1] if cells is not None else mean
                cell_row(lanes, quantized, out=row)
                if head is not None:
                    self.pool.update(head, row[:, None, :], index + 1)
        self.tokens = np.concatenate([self.tokens, tokens])
        hidden = None
        if want or collect is not None:
            mean_lanes = lanes.mean(axis=1)
            hidden = zc_norm(mean_lanes, weights.final_norm)
        logits = None
        if want:
            rows = hidden if want == "all" else hidden[-1:]
            logits = rotate(rows) @ weights.lm_head  # rotated domain (weights.py)
        if collect is not None:
            collect("tokens", tokens)
            collect("emb_row", emb)
            collect("emb_row_scaled", x0)
            collect("engram_idx", engram.idx)
            empty = np.zeros((0, count, d), F32)
            keys, values = engram.keys, engram.values
            collect("engram_k", np.stack(keys) if keys else empty, axis=1)
            collect("engram_v", np.stack(values) if values else empty, axis=1)
            collect("cells", cells)
            collect("final_hidden", hidden)
            if logits is not None:
                collect("logits", logits)
        return logits
