"""One decode state per sequence: caches, engram state, confidence cells (fixture README
step 5), each of the kind the model's numerics make (`numerics.py`).

`prefill`, `step` and `extend` run their tokens in chunks of `chunk` positions
(`models.chunking`) through the one batch forward (`forward.forward`) with this session as
its one item: a decode step is a chunk of one position, in either numerics.
Layers attend exactly as upstream's forward (full causal on global layers, `sliding_window`
on the others), or, with `kv_window=`, every layer is additionally bounded to the last
`kv_window` positions (a ring of that many slots), as the shipped engine does (README
`_kvwin` arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...errors import ModelInputError
from ..protocol import SessionCapabilities
from ..rewind import rewind_count
from .cache import new_caches
from .forward import Collector, Item, joined, run_chunks
from .protocol import BlockModel

F32 = np.float32
# Positions per prefill chunk: larger chunks run the weight GEMMs at a better M (~100 vs
# ~80 GFLOP/s at 64), but every [CHUNK, ...] temporary grows with it and the heap they churn
# through stays resident: 128 costs ~3% of 512-token prefill speed against 256 and ~7 MB
# less peak RSS. A multiple of `attention.ATTN_BLOCK`, so attention blocks fall on the same
# positions whatever the chunk size. The caches left are the same up to float32 rounding:
# only BLAS's choice of kernel for the small-N products (cond_v, phi) depends on the row
# count.
CHUNK = 128
Trace = Callable[[str, np.ndarray], None]


class V3Session:
    """Incremental decoding state of one sequence; the model's weights are shared read-only.
    `model` is a `V3Model` (anything with its config, weights, numerics and step plan, and
    `check_ids`)."""

    def __init__(
        self, model: BlockModel, kv_window: int | None = None, trace: Trace | None = None,
        chunk: int = CHUNK,
    ) -> None:
        if kv_window is not None and kv_window <= 0:
            raise ModelInputError(f"kv_window must be positive, got {kv_window}")
        if not isinstance(chunk, int) or chunk <= 0:
            raise ModelInputError(f"chunk must be a positive int, got {chunk!r}")
        self.chunk = chunk
        self.model = model
        self.kv_window = kv_window
        self.trace = trace
        self._start()

    def _start(self) -> None:
        """The state before any token: fresh caches, engram state and cells."""
        model = self.model
        cfg, weights, num = model.config, model.weights, model.num
        self.caches = new_caches(cfg, num.cache_type, [layer.window for layer in weights.layers],
                                 self.kv_window)
        self.engram = num.engram_state(cfg, len(weights.engram))
        self.cells = num.cell_state(weights.confidence)
        self.tokens = np.zeros(0, np.int64)

    @property
    def capabilities(self) -> SessionCapabilities:
        """`models/protocol.py`: exact extend/rewind in deploy numerics, fork, pooled head."""
        return SessionCapabilities(extend=True, rewind=True, exact=self.model.exact,
                                   fork=True, confidence=True, chunk=self.chunk)

    @property
    def position(self) -> int:
        """Tokens consumed so far (the position the next token takes)."""
        return len(self.tokens)

    def consumed(self) -> np.ndarray:
        """Every token consumed so far (int64)."""
        return self.tokens

    def fork(self) -> V3Session:
        """An independent copy of this state (both may continue differently)."""
        other = V3Session.__new__(V3Session)
        other.model, other.kv_window, other.trace = self.model, self.kv_window, self.trace
        other.chunk = self.chunk
        other.caches = [cache.copy() for cache in self.caches]
        other.engram = self.engram.copy()
        other.cells = None if self.cells is None else self.cells.copy()
        other.tokens = self.consumed().copy()
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
        if self.cells is None:
            return None
        if not self.position:
            raise ModelInputError("confidence_logit: the session has consumed no tokens")
        if self._bounded_differs():
            return self.model.confidence_logit(self.consumed())
        return self.cells.logit()

    def rewind(self, n: int) -> None:
        """Undo the last `n` positions exactly, as if they had never been consumed: the next
        step or extend gives the same bits as it would have then. Deploy numerics keep what
        this needs for up to MAX_REWIND (64) positions (ring slack, raw conv rows, engram
        values, unfolded confidence cells); float numerics rebuild the state by re-running the
        kept tokens (float rounding may then differ from the original steps')."""
        n = rewind_count(n, self.position)
        if n == 0:
            return
        kept = self.consumed()[: self.position - n]
        limit = self.model.num.max_rewind
        if limit is None:  # float numerics: start over and re-run the kept tokens
            self._start()
            if len(kept):
                self.prefill(kept, logits=False)
            return
        if n > limit:
            raise ModelInputError(f"cannot rewind {n} positions: at most {limit} are kept")
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
    def item(self, tokens: np.ndarray, want: str) -> Item:
        """This session's chunk `tokens` as an item of the batch forward (`run_batch`); the
        caller records them with `took` once the forward ran."""
        return Item(tokens, self.consumed(), self.caches, self.engram, self.cells, want)

    def took(self, tokens: np.ndarray) -> None:
        """Record that the forward consumed `tokens` (after it advanced this state)."""
        self.tokens = np.concatenate([self.consumed(), tokens])

    def _run(self, ids, want: str, trace: Trace | None) -> np.ndarray | None:
        model = self.model
        tokens = model.check_ids(ids, self.position)
        trace = trace or self.trace
        collect = Collector() if trace is not None else None
        # Every position runs through the one forward: a step is a chunk
        # of one; in deploy numerics with the same bits as in any prefill (docs/numerics.md).
        outputs = []
        for chunk, logits in run_chunks(model, tokens, self.consumed(), self.caches,
                                        self.engram, self.cells, self.chunk, want, collect):
            self.tokens = np.concatenate([self.tokens, chunk])
            if logits is not None:
                outputs.append(logits)
        if collect is not None:
            collect.emit(trace)
        return joined(outputs)
