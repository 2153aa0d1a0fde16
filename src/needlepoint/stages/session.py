"""A decode state of a staged model: the head's part here, each stage's caches on its stage.

The head keeps the part of the state that depends on the tokens alone (`part.head_state()`:
the tokens' positions, and for Needle 3 the engram history and confidence row 0); each stage
keeps its blocks' caches (and confidence rows) under the session's id. A call to `prefill` /
`step` / `extend` is cut into chunks; every chunk's calls (stage 0 -> 1 -> ... -> K-1) are
submitted without waiting, so the stages work on consecutive chunks at once, and only the
chunks whose logits are asked for reach the LM head. `rewind(n)` undoes positions on the head
and every stage exactly (exact numerics; float numerics re-run the kept tokens, as a
single-process session does), so speculative decoding runs on staged models. Any failure
leaves the session unusable (its stages may have advanced unevenly): it raises, and a new
session is needed.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import (
    ModelInputError,
    StageError,
    StageNonFiniteError,
    StageSessionLostError,
)
from ..models.layer_range import chunks
from ..models.protocol import SessionCapabilities
from ..models.rewind import rewind_count
from .head import embed_chunk
from .interface import StagedModelView
from .stage import check_kv_window, finite

CHUNK = 128  # positions per chunk when none is given (exact numerics: any gives the same bits)


@dataclass
class Launched:
    """A call whose chunks are submitted: the futures of the wanted rows, the tokens."""

    session: StagedSession
    tokens: np.ndarray
    outputs: list  # last stage's future per chunk (None-valued where no rows are wanted)
    want: str


class StagedSession:
    """Incremental decoding state of one sequence across the stages (a session's interface:
    prefill, step, extend, fork, rewind, position, consumed, confidence_logit)."""

    def __init__(self, model: StagedModelView, kv_window: int | None = None, chunk: int = CHUNK):
        check_kv_window(kv_window)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
            raise ModelInputError(f"chunk must be a positive int, got {chunk!r}")
        self.model, self.kv_window, self.chunk = model, kv_window, chunk
        self.sid = uuid.uuid4().hex
        self.broken: str | None = None
        self.tokens = np.zeros(0, np.int64)
        self.head = model.part.head_state()
        self._register()
        self.incarnations = model.recovery.run(  # a stage lost meanwhile: wait, open again
            [self], lambda: self.model.transport.call_all("open", self.sid, kv_window))

    def _register(self) -> None:
        """Free the stages' caches when this session is closed or collected (registered
        before they are opened: a stage that did open keeps nothing if another failed)."""
        self._finalizer = weakref.finalize(self, _close_everywhere, self.model.transport,
                                           self.sid, self.model.recovery)
        self._finalizer.atexit = False  # at exit the stages go with the process / Ray
        self.model.recovery.track(self)  # replayed if a stage is lost (recovery.py)

    def replayable(self) -> bool:
        """Open and not failed for another reason than a lost stage (recovery.py)."""
        return self._finalizer.alive and self.broken is None

    # -- state -------------------------------------------------------------------------------
    @property
    def capabilities(self) -> SessionCapabilities:
        """`models/protocol.py`: extend/rewind (exact in exact numerics), fork, pooled head."""
        return SessionCapabilities(extend=True, rewind=True, exact=self.model.part.exact, fork=True,
                                   confidence=True, chunk=self.chunk)

    @property
    def position(self) -> int:
        """Tokens consumed so far (the position the next token takes)."""
        return len(self.tokens)

    def consumed(self) -> np.ndarray:
        """Every token consumed so far (int64)."""
        return self.tokens

    def fork(self) -> StagedSession:
        """An independent copy of this state (each stage copies its caches)."""
        return self.model.recovery.run([self], self._fork)

    def _fork(self) -> StagedSession:
        self.check_usable()
        other = StagedSession.__new__(StagedSession)
        other.model, other.kv_window, other.chunk = self.model, self.kv_window, self.chunk
        other.sid = uuid.uuid4().hex
        other.broken = None
        other.tokens = self.tokens.copy()
        other.head = self.head.copy()
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
        """Consume `ids`; the logits [vocab] at the last of them (None with logits=False)."""
        out = self._run(ids, "last" if logits else "none", trace)
        return None if out is None else out[-1]

    def step(self, token_id: int, *, trace: Any = None) -> np.ndarray:
        """Consume one token; returns the logits [vocab] for the next position."""
        return self._run([token_id], "last", trace)[-1]

    def extend(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Consume `ids`; the logits [len(ids), vocab] after each of them."""
        return self._run(ids, "all", None)

    def rewind(self, n: int) -> None:
        """Undo the last `n` positions on the head and every stage, as if never consumed.
        Exact numerics undo them in place (Needle 3: up to 64 positions, as one process);
        float numerics re-run the kept tokens through the stages."""
        n = rewind_count(n, self.position)
        if n == 0:
            return
        self.model.recovery.run([self], lambda: self._rewind(n))

    def _rewind(self, n: int) -> None:
        self.check_usable()
        part, kept = self.model.part, self.tokens[: self.position - n].copy()
        if not part.exact:  # start over on every stage, then re-run the kept tokens
            self.incarnations = self.model.transport.call_all("open", self.sid,
                                                              self.kv_window)
            self.head, self.tokens = part.head_state(), np.zeros(0, np.int64)
            if len(kept):
                self.prefill(kept, logits=False)
            return
        if part.max_rewind is not None and n > part.max_rewind:
            raise ModelInputError(f"cannot rewind {n} positions: at most {part.max_rewind} "
                                  "are kept")
        try:
            self.head.rewind_to(len(kept))
            self.model.transport.call_all("rewind", self.sid, len(kept))
        except BaseException as error:
            self._fail(error)
            raise
        self.tokens = kept

    def confidence_logit(self) -> float | None:
        """Confidence-head logit over every token consumed so far (None without the head):
        row 0 pooled here, each block's row on its stage (recomputed full-causal when a
        kv_window has cut a layer's attention, as one process does)."""
        part = self.model.part
        if not part.has_confidence_head:
            return None
        if not self.position:
            raise ModelInputError("confidence_logit: the session has consumed no tokens")
        return self.model.recovery.run([self], self._confidence_logit)

    def _confidence_logit(self) -> float | None:
        part = self.model.part
        self.check_usable()
        if part.window_cuts(self.kv_window, self.position):
            return self.model.confidence_logit(self.tokens)
        transport = self.model.transport
        rows = transport.gather([transport.submit(k, "pool_rows", self.sid)
                                 for k in range(len(self.model.plan))])
        return part.confidence_logit(
            self.head, [(r.first, pool) for r, pool in zip(self.model.plan.ranges, rows,
                                                             strict=True)])

    # -- the pipeline ------------------------------------------------------------------------
    def check_usable(self) -> None:
        """Raise StageSessionLostError when a lost stage broke this session (the pipeline
        checks every session of a batch before it moves any)."""
        if self.broken:
            raise StageSessionLostError(f"this session cannot continue: {self.broken}; start "
                                        f"a new session")

    def _run(self, ids, want: str, trace: Any) -> np.ndarray | None:
        if trace is not None:
            raise ModelInputError("trace= is not supported on a model cut into stages")
        return self.model.recovery.run([self], lambda: self.finish(self.launch(ids, want)))

    def launch(self, ids, want: str) -> Launched:
        """Submit every chunk of `ids` through the stages without waiting for any."""
        model = self.model
        part = model.part
        tokens = part.check_ids(ids, self.position)
        self.check_usable()
        transport, ranges = model.transport, model.plan.ranges
        start, outputs = self.position, []
        try:
            for piece in chunks(len(tokens), self.chunk, want):
                chunk, rows = tokens[piece.first : piece.end], piece.rows
                embedded = embed_chunk(part, self.head, chunk, start)
                sent: Any = embedded.x
                for k, stage in enumerate(ranges):
                    side = {b: v for b, v in embedded.side.items() if stage.first <= b < stage.end}
                    sent = transport.submit(k, "run", self.sid, start, sent, side,
                                            rows if k == len(ranges) - 1 else None)
                outputs.append(sent)
                start += len(chunk)
        except BaseException as error:
            self._fail(error)
            raise
        return Launched(self, tokens, outputs, want)

    def finish(self, launched: Launched) -> np.ndarray | None:
        """Wait for a launched call; its logits (None when none were asked for)."""
        model = self.model
        try:
            results = model.transport.gather(launched.outputs)
            parts = []
            for rows in results:
                if rows is None:
                    continue
                if not finite(rows):
                    raise StageNonFiniteError(f"the head received non-finite activations "
                                              f"from stage {len(model.plan) - 1}")
                parts.append(model.part.readout(np.asarray(rows)))
        except BaseException as error:
            self._fail(error)
            raise
        self.tokens = np.concatenate([self.tokens, launched.tokens])
        if not parts:
            return None
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _fail(self, error: BaseException) -> None:
        where = f" on stage {error.stage}" if isinstance(error, StageError) and \
            error.stage is not None else ""
        self.broken = f"a call failed{where} ({type(error).__name__}: {error})"


def _close_everywhere(transport, sid: str, recovery) -> None:
    recovery.forget(sid)
    for k in range(len(transport.specs)):
        transport.fire(k, "close", sid)
