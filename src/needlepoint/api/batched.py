"""The pieces the scheduler (`scheduler.py`) hands out and runs: session proxies, the model
view a request decodes through, a unit of pending work, and the batched model call.

A request never touches its model session itself. Its turn (the ordinary generator,
`generation/turn.py`) is given a `BatchedSession` whose `prefill`/`step` queue a `Work` item
and block until the scheduler's engine step has run it; the scheduler thread runs the work
of every live request together, one model call per engine step (`run_batch`).

`LeasedModel` is the model as one request sees it: everything of the model (tokenizer,
config, heads) except `session()`, which opens proxies under the request's lease, so
`Needle`, `Conversation` and the turn generator run unchanged on top of the scheduler.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelInputError

# Positions per prefill chunk when a session does not say (`V3Session.chunk`): chunks the
# scheduler cuts are multiples of it, so a session's own chunking is the same as alone.
DEFAULT_UNIT = 128


@dataclass(eq=False)
class Work:
    """One pending request to the model: append `ids` to `proxy`'s session (a prefill, a
    step or an extend), or run `call(session)` (fork, confidence head) on the scheduler
    thread; either after undoing the session's last `rewind` positions (a deferred rewind)."""

    proxy: BatchedSession
    ids: np.ndarray | None = None
    all_logits: bool = False  # logits of every position ([len(ids), vocab]) else the last row
    want: bool = True  # the caller wants logits at all (prefill(logits=False) does not)
    call: Callable[[Any], Any] | None = None
    rewind: int = 0
    fed: int = 0  # ids already run (a prefill is cut into chunks over several steps)
    parts: list[np.ndarray] = field(default_factory=list)  # all_logits rows so far
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def remaining(self) -> int:
        return 0 if self.ids is None else len(self.ids) - self.fed

    @property
    def decode_like(self) -> bool:
        """A step, or an extend of at most one chunk (a speculative draft being verified):
        run whole in the next step, beside the other decode steps."""
        return self.remaining == 1 or (self.all_logits and self.fed == 0
                                       and self.remaining <= max(1, int(self.proxy.unit)))

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class BatchedSession:
    """A model session whose work runs on the scheduler: the `Session` interface of
    `generation/turn.py` (`position`, `prefill`, `step`), plus `extend`, and `rewind`,
    `fork`, `confidence_logit` and `chunk` when the model's own session has them. With
    `extend` and `rewind` (and `exact_extend`, as the model's session) a turn verifies
    speculative drafts through the scheduler (`generation/speculate.py`): each draft is one
    multi-row item of an engine step. A rewind costs no step of its own: it is recorded and
    applied by the engine thread just before this session's next work."""

    def __init__(self, lease: Any, session: Any) -> None:
        self._lease = lease
        self._session: Any = session  # None once the scheduler has freed it (cancelled)
        self._rewind = 0  # positions to undo before the next work
        self.unit = getattr(session, "chunk", DEFAULT_UNIT)

    @property
    def session(self) -> Any:
        """The model's own session (only the scheduler thread runs model work on it)."""
        session = self._session
        if session is None:
            self._lease.check()  # raises the cancellation that freed it
            raise RuntimeError("the session was freed")  # pragma: no cover
        return session

    @property
    def model(self) -> Any:
        return getattr(self.session, "model", None)

    @property
    def position(self) -> int:
        return self.session.position - self._rewind

    @property
    def exact_extend(self) -> bool:
        """Whether `extend` rows are the bits of single steps (as for the model's session)."""
        from ..generation.speculate import speculation_supported

        return speculation_supported(self.session)

    @property
    def chunk(self) -> int:
        if not isinstance(getattr(self.session, "chunk", None), int):
            raise AttributeError("chunk")
        return self.unit

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

    @property
    def rewind(self) -> Callable[[int], None]:
        if not hasattr(self.session, "rewind"):
            raise AttributeError("rewind")
        return self._rewind_later

    def _rewind_later(self, count: int) -> None:
        count = int(count)
        if not 0 <= count <= self.position:
            raise ModelInputError(f"cannot rewind {count} of {self.position} positions")
        self._rewind += count

    def _work(self, **fields: Any) -> Any:
        rewind, self._rewind = self._rewind, 0
        try:
            return self._lease.submit(Work(self, rewind=rewind, **fields))
        except BaseException:
            self._rewind += rewind if self._session is not None else 0
            raise

    def _run(self, ids: Any, *, all_logits: bool, want: bool) -> Any:
        check = getattr(self.model, "check_ids", None)
        # Checked here, on the request's thread: a bad request fails alone, never the batch.
        tokens = check(ids, self.position) if check is not None else np.asarray(ids, np.int64)
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        return self._work(ids=tokens, all_logits=all_logits, want=want)

    @property
    def fork(self) -> Callable[[], BatchedSession]:
        if not hasattr(self.session, "fork"):
            raise AttributeError("fork")
        return lambda: BatchedSession(self._lease, self._work(call=lambda s: s.fork()))

    @property
    def confidence_logit(self) -> Callable[[], float | None]:
        if not hasattr(self.session, "confidence_logit"):
            raise AttributeError("confidence_logit")
        return lambda: self._work(call=lambda s: s.confidence_logit())


class LeasedModel:
    """The served model as one request sees it: `session()` opens `BatchedSession`s under
    the request's lease; every other attribute is the model's own."""

    def __init__(self, model: Any, lease: Any) -> None:
        self._model = model
        self._lease = lease

    @property
    def model(self) -> Any:
        return self._model

    def session(self, kv_window: int | None = None, **options: Any) -> BatchedSession:
        if kv_window is not None:
            options["kv_window"] = kv_window
        self._lease.check()
        return BatchedSession(self._lease, self._model.session(**options))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def run_batch(model: Any, items: list[tuple[Any, np.ndarray, bool, bool]], batched: bool
              ) -> list[np.ndarray | None]:
    """Run (session, ids, all_logits, want) items: one `model.run_batch` call (the weights
    read once for every row) when `batched`, else each item alone, one after the other.
    Per item: logits [len(ids), vocab] (all_logits), the last row [vocab], or None when
    not wanted (the sequential path then skips the LM head)."""
    if batched:
        out = model.run_batch([(session, ids, every) for session, ids, every, _ in items])
        return [logits if want else None for logits, (_, _, _, want) in zip(out, items,
                                                                             strict=True)]
    results: list[np.ndarray | None] = []
    for session, ids, every, want in items:
        if every:
            results.append(session.extend(ids))
        elif len(ids) == 1 and want:
            results.append(session.step(int(ids[0])))
        else:
            results.append(session.prefill(ids, logits=want))
    return results


def plan_step(works: list[Work], step_tokens: int, new_first: bool = False
              ) -> list[tuple[Work, int]]:
    """One engine step's items, (work, tokens to run): every pending decode step (one token,
    or a short extend: a draft), then prefill chunks in submission order while the budget of
    `step_tokens` rows lasts. A chunk that does not finish its prefill is a multiple of the
    session's own chunk (so the session cuts the prompt where it would alone), and the
    oldest prefill always advances,
    however many decode steps there are. With `new_first`, when a prefill that has not started
    is waiting, the step runs only the first chunks of such prefills: a new request's first
    token then waits for its own prompt only, not for the decode rows of every other request
    (the caller alternates, so decoders lose at most one step to it)."""
    if new_first and any(w.fed == 0 and not w.decode_like for w in works):
        works = [w for w in works if w.fed == 0 and not w.decode_like]
    steps = [(w, w.remaining) for w in works if w.decode_like]
    budget = step_tokens - sum(n for _, n in steps)
    plan = list(steps)
    for work in works:
        left = work.remaining
        if work.decode_like:
            continue
        unit = max(1, int(work.proxy.unit))
        if left <= budget:
            take = left
        elif budget >= unit:
            take = budget // unit * unit
        elif len(plan) == len(steps):  # the oldest prefill always advances
            take = min(left, unit)
        else:
            break
        plan.append((work, take))
        budget -= take
        if budget <= 0:
            break
    return plan


SKIPPED = frozenset({"model", "_model", "core", "_core", "cfg", "config", "weights", "trace",
                     "_trace", "head"})


def session_bytes(session: Any) -> int:
    """Bytes of the arrays a session holds (its KV cache, tails, history), counted at their
    full capacity: the cache stores are mapped lazily, so this bounds what a session can
    come to hold, however long it runs. References back to the model are not followed."""
    seen: set[int] = set()

    def walk(value: Any, depth: int) -> int:
        if id(value) in seen or depth > 4:
            return 0
        seen.add(id(value))
        if isinstance(value, np.ndarray):
            return int(value.nbytes)
        if isinstance(value, list | tuple):
            return sum(walk(v, depth + 1) for v in value)
        if isinstance(value, dict):
            return sum(walk(v, depth + 1) for v in value.values())
        attrs = getattr(value, "__dict__", None)
        if attrs is None or isinstance(value, type):
            return 0
        return sum(walk(v, depth + 1) for k, v in attrs.items() if k not in SKIPPED)

    return walk(session, 0)
