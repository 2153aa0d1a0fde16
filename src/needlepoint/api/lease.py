"""A request's side of the continuous-batching scheduler (`scheduler.py`): its lease, the
model as the request sees it, and the session proxies its turn decodes on.

A request never touches its model session itself. Its turn (the ordinary generator,
`generation/turn.py`) is given a `BatchedSession` whose `prefill`/`step` queue a `Work` item
(`batched.py`) and block until the scheduler's engine step has run it; the scheduler thread
runs the work of every live request together, one model call per engine step.

`LeasedModel` is the model as one request sees it: the `ModelProtocol` (`models/protocol.py`)
of the model, except that `session()` opens proxies under the request's lease, so `Needle`,
`Conversation` and the turn generator run unchanged on top of the scheduler. The scheduler
sees a proxy only through its public side (`lease`, `unit`, `session`, `free`:
nothing reads the proxy's private state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import ModelInputError, NeedlepointError
from ..generation.draft_policy import share_policy
from ..models.protocol import ModelCapabilities, ModelProtocol, SessionCapabilities
from ..models.wrapping import WrapsModelText
from .batched import DEFAULT_UNIT, Work


class RequestCancelled(NeedlepointError):
    """The request was cancelled (its client went away); its session has been freed."""


class SchedulerClosed(RequestCancelled):
    """The scheduler was shut down while the request was running."""


class Owner(Protocol):
    """What a lease needs of its scheduler (`scheduler.Scheduler`)."""

    model: Any
    stopped: bool

    def submit(self, lease: Lease, work: Work) -> Any: ...

    def release(self, lease: Lease, *, cancelled: bool) -> None: ...


class Lease:
    """One request's place in the scheduler: its KV reservation and every session it opens
    (`lease.model.session()`). `cancel()` (any thread) frees them at the next engine step;
    `close()` when the request is done. Both are idempotent."""

    def __init__(self, scheduler: Owner, kv_bytes: int, number: int) -> None:
        self.scheduler = scheduler
        self.kv_bytes = kv_bytes
        self.number = number  # 1, 2, ... in admission order (the step log names leases so)
        self.model = LeasedModel(scheduler.model, self)
        self.cancelled = False
        self.closed = False

    def check(self) -> None:
        """RequestCancelled (or SchedulerClosed) if this lease can no longer run work."""
        if self.scheduler.stopped:
            raise SchedulerClosed("the scheduler was shut down")
        if self.cancelled:
            raise RequestCancelled("the request was cancelled")
        if self.closed:
            raise RequestCancelled("the request's lease is closed")

    def submit(self, work: Work) -> Any:
        return self.scheduler.submit(self, work)

    def cancel(self) -> None:
        self.scheduler.release(self, cancelled=True)

    def close(self) -> None:
        self.scheduler.release(self, cancelled=False)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BatchedSession:
    """A model session whose work runs on the scheduler: the `SessionProtocol` with the
    capabilities of the model's own session (`extend` always: it is how the engine runs a
    draft). With exact `extend` and `rewind` a turn verifies speculative drafts through the
    scheduler (`generation/speculate.py`): each draft is one multi-row item of an engine
    step. A rewind costs no step of its own: it is recorded and applied by the engine thread
    just before this session's next work (`Work.rewind`)."""

    def __init__(self, lease: Lease, model: ModelProtocol, session: Any) -> None:
        self.lease = lease
        self.model = model  # the served model (checks ids on the request's thread)
        self._session: Any = session  # None once the scheduler has freed it (cancelled)
        self._rewind = 0  # positions to undo before the next work
        self._inner = session.capabilities
        self.unit = self._inner.chunk or DEFAULT_UNIT

    @property
    def session(self) -> Any:
        """The model's own session (only the scheduler thread runs model work on it)."""
        session = self._session
        if session is None:
            self.lease.check()  # raises the cancellation that freed it
            raise RuntimeError("the session was freed")  # pragma: no cover
        return session

    def free(self) -> None:
        """Drop the model's session (the scheduler, for a cancelled request): its KV cache
        goes with the last reference."""
        self._session = None

    @property
    def capabilities(self) -> SessionCapabilities:
        inner = self._inner
        return dataclasses.replace(inner, extend=True,
                                   exact=inner.extend and inner.rewind and inner.exact)

    @property
    def chunk(self) -> int | None:
        """The model's session's prefill chunk (docs/api.md: as the session's own)."""
        return self._inner.chunk

    @property
    def position(self) -> int:
        return self.session.position - self._rewind

    def prefill(self, ids: Sequence[int] | np.ndarray, logits: bool = True) -> np.ndarray | None:
        """Consume `ids`; the logits [vocab] after the last one (None with logits=False)."""
        out = self._run(ids, all_logits=False, want=logits)
        return out if logits else None

    def step(self, token_id: int) -> np.ndarray:
        """Consume one token; the logits [vocab] for the next position."""
        return self._run([token_id], all_logits=False, want=True)

    def extend(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Consume `ids`; the logits [len(ids), vocab] after each of them."""
        return self._run(ids, all_logits=True, want=True)

    def rewind(self, count: int) -> None:
        """Undo the last `count` positions (applied before this session's next work)."""
        self._needs("rewind", self._inner.rewind)
        count = int(count)
        if not 0 <= count <= self.position:
            raise ModelInputError(f"cannot rewind {count} of {self.position} positions")
        self._rewind += count

    def fork(self) -> BatchedSession:
        """A copy of the session so far (an exclusive call between engine steps)."""
        self._needs("fork", self._inner.fork)
        return BatchedSession(self.lease, self.model, self._work(call=lambda s: s.fork()))

    def confidence_logit(self) -> float | None:
        """The session's pooled confidence head (an exclusive call between engine steps)."""
        self._needs("confidence_logit", self._inner.confidence)
        return self._work(call=lambda s: s.confidence_logit())

    @staticmethod
    def _needs(capability: str, offered: bool) -> None:
        if not offered:
            raise ModelInputError(f"this model's sessions do not offer {capability} "
                                  "(models/protocol.py SessionCapabilities)")

    def _work(self, **fields: Any) -> Any:
        rewind, self._rewind = self._rewind, 0
        try:
            return self.lease.submit(Work(self, rewind=rewind, **fields))
        except BaseException:
            self._rewind += rewind if self._session is not None else 0
            raise

    def _run(self, ids: Any, *, all_logits: bool, want: bool) -> Any:
        # Checked here, on the request's thread: a bad request fails alone, never the batch.
        tokens = np.asarray(self.model.check_ids(ids, self.position), np.int64).reshape(-1)
        return self._work(ids=tokens, all_logits=all_logits, want=want)


class LeasedModel(WrapsModelText):
    """The served model as one request sees it: the model's `ModelProtocol`, with
    `session()` opening `BatchedSession`s under the request's lease (and no `run_batch` of
    its own: the scheduler batches). Speculative drafts learn into the model's policy."""

    def __init__(self, model: ModelProtocol, lease: Lease) -> None:
        self.model = model
        self._lease = lease
        share_policy(self, model)

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def capabilities(self) -> ModelCapabilities:
        return dataclasses.replace(self.model.capabilities, run_batch=False, pipeline_depth=1)

    def session(self, kv_window: int | None = None, **options: Any) -> BatchedSession:
        if kv_window is not None:
            options["kv_window"] = kv_window
        self._lease.check()
        return BatchedSession(self._lease, self.model, self.model.session(**options))

    def forward(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return self.model.forward(ids)

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        return self.model.check_ids(ids, position)

    def confidence_logit(self, ids: Sequence[int] | np.ndarray) -> float | None:
        return self.model.confidence_logit(ids)

    def embed(self, text: str) -> np.ndarray:
        """The model's contrastive embedding (only when `capabilities.embedding`)."""
        return self.model.embed(text)  # type: ignore[attr-defined]
