"""The engine side of the scheduler (`scheduler.py`): a unit of pending work, how one engine
step is planned, the batched model call, and a session's KV bytes.

Requests queue `Work` through their session proxies (`lease.BatchedSession`); the
scheduler thread runs the work of every live request together, one model call per engine
step (`run_batch`). The engine sees a proxy only through `Proxy`: its lease, its unit, the
model's own session, and `free()`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

# Positions per prefill chunk when a session does not say (`SessionCapabilities.chunk`):
# chunks the scheduler cuts are multiples of it, so a session's own chunking is the same as
# alone.
DEFAULT_UNIT = 128


class Proxy(Protocol):
    """What the engine needs of a request's session proxy (`lease.BatchedSession`)."""

    lease: Any  # `lease.Lease`: `number`, `cancelled`, `check()`
    unit: int  # the session's prefill chunk: chunks that do not end a prompt are multiples

    @property
    def session(self) -> Any: ...  # the model's own session

    def free(self) -> None: ...


@dataclass(eq=False)
class Work:
    """One pending request to the model: append `ids` to `proxy`'s session (a prefill, a
    step or an extend), or run `call(session)` (fork, confidence head) on the scheduler
    thread; either after undoing the session's last `rewind` positions (a deferred rewind)."""

    proxy: Proxy
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
