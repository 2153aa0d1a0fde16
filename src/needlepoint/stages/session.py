"""A decode state of a staged model: the head's part here, each stage's caches on its stage.

The head keeps the tokens, the engram tail and confidence row 0; each stage keeps its blocks'
caches and confidence rows under the session's id. A call to `prefill` / `step` / `extend`
is cut into chunks; every chunk's calls (stage 0 -> 1 -> ... -> K-1) are submitted without
waiting, so the stages work on consecutive chunks at once, and only the chunks whose logits
are asked for reach the LM head. Any failure leaves the session unusable (its stages may have
advanced unevenly): it raises, and a new session is needed.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    ModelInputError,
    NonFiniteActivationError,
    StageError,
    StageNonFiniteError,
    StageSessionLostError,
)
from ..models.needle3.engram import EngramTail, new_tail
from ..models.needle3.heads import ConfidencePool
from ..models.needle3.session import CHUNK, bounded_window
from .head import embed, read_out
from .stage import check_kv_window, finite

if TYPE_CHECKING:  # pragma: no cover
    from .model import StagedModel


@dataclass
class Launched:
    """A call whose chunks are submitted: the futures of the wanted rows, the state after."""

    session: StagedSession
    tokens: np.ndarray
    outputs: list  # last stage's future per chunk (None-valued where no rows are wanted)
    tail: EngramTail
    want: str


class StagedSession:
    """Incremental decoding state of one sequence across the stages (V3Session's interface)."""

    def __init__(self, model: StagedModel, kv_window: int | None = None, chunk: int = CHUNK):
        check_kv_window(kv_window)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
            raise ModelInputError(f"chunk must be a positive int, got {chunk!r}")
        self.model, self.kv_window, self.chunk = model, kv_window, chunk
        self.sid = uuid.uuid4().hex
        self.broken: str | None = None
        self.tokens = np.zeros(0, np.int64)
        head = model.weights.confidence
        self.pool = ConfidencePool.empty(head) if head is not None else None
        self.engram_tail = new_tail(model.config, len(model.weights.engram))
        self._register()
        self.incarnations = model.transport.call_all("open", self.sid, kv_window)

    def _register(self) -> None:
        """Free the stages' caches when this session is closed or collected (registered
        before they are opened: a stage that did open keeps nothing if another failed)."""
        self._finalizer = weakref.finalize(self, _close_everywhere, self.model.transport,
                                           self.sid)
        self._finalizer.atexit = False  # at exit the stages go with the process / Ray

    # -- state -------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Tokens consumed so far (the position the next token takes)."""
        return len(self.tokens)

    def consumed(self) -> np.ndarray:
        """Every token consumed so far (int64)."""
        return self.tokens

    def fork(self) -> StagedSession:
        """An independent copy of this state (each stage copies its caches)."""
        self._usable()
        other = StagedSession.__new__(StagedSession)
        other.model, other.kv_window, other.chunk = self.model, self.kv_window, self.chunk
        other.sid = uuid.uuid4().hex
        other.broken = None
        other.tokens = self.tokens.copy()
        other.pool = self.pool.copy() if self.pool is not None else None
        other.engram_tail = self.engram_tail.copy()
        other._register()
        other.incarnations = self.model.transport.call_all("fork", self.sid, other.sid)
        return other

    __copy__ = fork

    def close(self) -> None:
        """Free this session's caches on every stage now (also done when it is collected)."""
        self._finalizer()

    # -- public steps ------------------------------------------------------------------------
    def prefill(self, ids: Sequence[int] | np.ndarray, *, logits: bool = True,
                trace: Any = None) -> np.ndarray | None:
        """Consume `ids`; the logits [vocab_out] at the last of them (None with logits=False)."""
        out = self._run(ids, "last" if logits else "none", trace)
        return None if out is None else out[-1]

    def step(self, token_id: int, *, trace: Any = None) -> np.ndarray:
        """Consume one token; returns the logits [vocab_out] for the next position."""
        return self._run([token_id], "last", trace)[-1]

    def extend(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Consume `ids`; the logits [len(ids), vocab_out] after each of them."""
        return self._run(ids, "all", None)

    def confidence_logit(self) -> float | None:
        """Confidence-head logit over every token consumed so far (None without the head):
        row 0 pooled here, each block's row on its stage (recomputed full-causal when a
        kv_window has cut a layer's attention, as V3Session does)."""
        if self.pool is None:
            return None
        if not self.position:
            raise ModelInputError("confidence_logit: the session has consumed no tokens")
        self._usable()
        if self._bounded_differs():
            return self.model.confidence_logit(self.tokens)
        pool = self.pool.copy()
        transport = self.model.transport
        rows = transport.gather([transport.submit(k, "pool_rows", self.sid)
                                 for k in range(len(self.model.plan))])
        for stage, (peak, total, pooled) in zip(self.model.plan.ranges, rows, strict=True):
            cells = slice(stage.first + 1, stage.end + 1)
            pool.peak[cells], pool.total[cells], pool.pooled[cells] = peak, total, pooled
        return pool.logit(self.model.weights.confidence)

    def _bounded_differs(self) -> bool:
        cfg = self.model.config
        for layer in range(cfg.num_layers):
            window = cfg.layer_window(layer)
            bounded = bounded_window(window, self.kv_window)
            if bounded != window and self.position > bounded:
                return True
        return False

    # -- the pipeline ------------------------------------------------------------------------
    def _usable(self) -> None:
        if self.broken:
            raise StageSessionLostError(f"this session cannot continue: {self.broken}; start "
                                        f"a new session")

    def _run(self, ids, want: str, trace: Any) -> np.ndarray | None:
        if trace is not None:
            raise ModelInputError("trace= is not supported on a model cut into stages")
        return self.finish(self.launch(ids, want))

    def launch(self, ids, want: str) -> Launched:
        """Submit every chunk of `ids` through the stages without waiting for any."""
        model = self.model
        tokens = model.check_ids(ids, self.position)
        self._usable()
        cfg, weights, quantized = model.config, model.weights, model.quantized
        transport, plan = model.transport, model.plan
        stages = len(plan)
        start, tail, outputs = self.position, self.engram_tail, []
        head = weights.confidence
        try:
            for first in range(0, len(tokens), self.chunk):
                chunk = tokens[first : first + self.chunk]
                last_chunk = first + self.chunk >= len(tokens)
                rows = "all" if want == "all" else ("last" if want == "last" and last_chunk
                                                     else "none")
                try:
                    part = embed(cfg, weights, quantized, chunk, start, tail)
                except NonFiniteActivationError as error:
                    raise StageNonFiniteError(f"the head (embedding / engram lookups, chunk "
                                              f"at position {start}): {error}") from None
                tail = part.tail
                if not finite(part.x0) or not all(
                        finite(k) and finite(v) for k, v in part.site_kv.values()):
                    raise StageNonFiniteError(f"the head computed non-finite embeddings or "
                                              f"engram values (chunk at position {start}); "
                                              f"not sent to stage 0")
                if self.pool is not None:
                    self.pool.update(head, part.x0[:, None, :], 0)
                sent: Any = part.x0
                for k in range(stages):
                    kv = {s: part.site_kv[s] for s in model.sites_of[k]}
                    sent = transport.submit(k, "run", self.sid, start, sent, kv,
                                            rows if k == stages - 1 else None)
                outputs.append(sent)
                start += len(chunk)
        except BaseException as error:
            self._fail(error)
            raise
        return Launched(self, tokens, outputs, tail, want)

    def finish(self, launched: Launched) -> np.ndarray | None:
        """Wait for a launched call; its logits (None when none were asked for)."""
        model = self.model
        try:
            results = model.transport.gather(launched.outputs)
            parts = []
            for means in results:
                if means is None:
                    continue
                if not finite(means):
                    raise StageNonFiniteError(f"the head received non-finite activations "
                                              f"from stage {len(model.plan) - 1}")
                parts.append(read_out(model.weights, np.asarray(means), model.quantized))
        except BaseException as error:
            self._fail(error)
            raise
        self.tokens = np.concatenate([self.tokens, launched.tokens])
        self.engram_tail = launched.tail
        if not parts:
            return None
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _fail(self, error: BaseException) -> None:
        where = f" on stage {error.stage}" if isinstance(error, StageError) and \
            error.stage is not None else ""
        self.broken = f"a call failed{where} ({type(error).__name__}: {error})"


def _close_everywhere(transport, sid: str) -> None:
    for k in range(len(transport.specs)):
        transport.fire(k, "close", sid)
