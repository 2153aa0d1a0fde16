"""Continuous batching: one engine thread owns the model and, at every engine step, runs the
pending work of every live request as one batched model call.

    scheduler = Scheduler(model, max_sessions=16)
    with scheduler.lease() as lease:             # AdmissionFull past the caps (HTTP 429)
        needle = Needle(tools, model=lease.model)    # sessions of lease.model are batched
        needle.complete("wake me at 6:45")

Each request runs its turn on its own thread, on `BatchedSession` proxies (`lease.py`):
`prefill`/`step` queue a `Work` item and wait. The engine thread, per step:

1. frees the sessions of cancelled leases (their waiting work fails with
   `RequestCancelled`) and returns their KV reservation;
2. runs small exclusive calls (a session fork, the confidence head) one by one;
3. takes every pending decode step (one token each) and fills the rest of the per-step token
   budget (`step_tokens`) with chunks of pending prefills, oldest first (chunked prefill:
   a long prompt never stalls the decoders for more than a budget's worth of rows); chunks
   are multiples of the session's own prefill chunk, and the oldest prefill always advances.
   When new requests are waiting (`new_first`, the default), their first chunks get a step
   of their own, so a new request's first token waits for its own prompt, not for everyone
   else's decode rows; the step after such a step always decodes;
4. makes one `model.run_batch` call for all of it (or, for a model without one, runs the
   items one after the other: `batched.run_batch`), and hands out the logits.

A model cut into stages (`pipeline_depth` K > 1) gets K engine loops: each takes at most its
share of the live requests' work (work another loop runs is left alone), so while one loop's
step is in the later stages the next loop's step enters the first: K micro-batches stay in
flight and the pipeline does not drain between steps (docs/distributed.md).

Requests join (a new lease's prefill) and leave (a finished turn, a closed lease) between
steps. Before a step the engine waits, briefly, for the requests it has just answered to
submit their next token (each one samples on its own thread), so a step carries all of them
instead of splitting into many small ones: until all have, or no new work arrived for
`gather_s`, or `max_gather_s` passed. Timing only decides how the work is grouped; in deploy
numerics a row's logits are the same bits in any group (docs/numerics.md).

Memory is bounded by admission (`admission.py`, the one place it is decided): at most
`max_sessions` leases, each reserving one session's KV bytes at full capacity
(`batched.session_bytes`), at most `max_kv_bytes` in all. Past either, `lease()` raises
`AdmissionFull` (or waits, with `wait=True`). The scheduler's `admission` also counts the
places of requests still waiting for a session (`max_queue`): the server's worker pool admits
its requests there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..generation.draft_policy import policy_for
from ..models.protocol import ModelProtocol
from .admission import Admission, AdmissionClosed, AdmissionFull
from .batched import Work, plan_step, run_batch, session_bytes
from .lease import BatchedSession, Lease, RequestCancelled, SchedulerClosed

__all__ = ["DEFAULT_STEP_TOKENS", "AdmissionFull", "Lease", "RequestCancelled", "Scheduler",
           "SchedulerClosed", "SchedulerFull"]

SchedulerFull = AdmissionFull  # its name before admission had a module of its own

DEFAULT_STEP_TOKENS = 256
DEFAULT_GATHER_S = 0.003
DEFAULT_MAX_GATHER_S = 0.05


class Scheduler:
    """Owns a model's sessions and batches their work (see the module docstring).

    `batched=None` uses `model.run_batch` when the model's capabilities offer it; False
    runs each item alone (still one engine thread, the same chunking and admission).
    `new_first=False` mixes new prompts' first chunks into the decode steps like later chunks.
    `max_kv_bytes=None` caps KV bytes at `max_sessions` sessions' worth; `max_queue` more
    requests may hold a place in `admission` while they wait. The engine thread
    starts with the first lease (`autostart=False`: only at `start()`) and ends with
    `close()`. `log_steps=True` keeps, per engine step, the `(lease.number, rows)` of every
    item it ran (`step_log`)."""

    def __init__(
        self,
        model: ModelProtocol,
        *,
        max_sessions: int = 16,
        max_kv_bytes: int | None = None,
        max_queue: int = 0,
        step_tokens: int = DEFAULT_STEP_TOKENS,
        gather_s: float = DEFAULT_GATHER_S,
        max_gather_s: float = DEFAULT_MAX_GATHER_S,
        batched: bool | None = None,
        new_first: bool = True,
        autostart: bool = True,
        log_steps: bool = False,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if step_tokens < 1:
            raise ValueError(f"step_tokens must be >= 1, got {step_tokens}")
        caps = model.capabilities
        has_batch = caps.run_batch
        if batched and not has_batch:
            raise ValueError("batched=True needs a model with run_batch")
        self.model = model
        self.batched = has_batch if batched is None else bool(batched)
        self.admission = Admission(max_sessions, max_queue,
                                   kv_bytes=session_bytes(model.session()),
                                   max_kv_bytes=max_kv_bytes)
        self.max_sessions = max_sessions
        self.session_kv_bytes = self.admission.kv_bytes
        self.max_kv_bytes = self.admission.max_kv_bytes
        self.step_tokens = step_tokens
        self.new_first = new_first
        self._new_only = False  # the last step ran only new prompts' first chunks
        self.gather_s, self.max_gather_s = gather_s, max_gather_s
        self.stopped = False
        self.autostart = autostart
        self.step_log: list[list[tuple[int, int]]] | None = [] if log_steps else None
        self._cond = threading.Condition()
        self._queue: list[Work] = []  # pending work, in submission order
        self._leases: set[Lease] = set()
        self._awaiting: set[Lease] = set()  # answered last step, not back with work yet
        self._last_arrival = 0.0
        self._thread: threading.Thread | None = None
        self.loops = max(1, caps.pipeline_depth) if self.batched else 1
        self._threads: list[threading.Thread] = []
        self._in_flight: set[int] = set()  # id() of work a loop is running
        self._stats = {"steps": 0, "rows": 0, "sessions_stepped": 0, "max_batch": 0, "calls": 0,
                       "leases": 0, "peak_leases": 0, "cancelled": 0}

    # -- admission -----------------------------------------------------------------------
    def lease(self, *, wait: bool = False, timeout: float | None = None) -> Lease:
        """A place for one request, or AdmissionFull when the caps are reached (with
        `wait=True`: blocks until one is free, AdmissionFull after `timeout` seconds)."""
        if self.stopped:
            raise SchedulerClosed("the scheduler was shut down")
        try:
            kv = self.admission.reserve(wait=wait, timeout=timeout)
        except AdmissionClosed:
            raise SchedulerClosed("the scheduler was shut down") from None
        with self._cond:
            if self.stopped:
                self.admission.unreserve(kv)
                raise SchedulerClosed("the scheduler was shut down")
            self._stats["leases"] += 1
            lease = Lease(self, kv, self._stats["leases"])
            self._leases.add(lease)
            self._stats["peak_leases"] = max(self._stats["peak_leases"], len(self._leases))
            if self.autostart:
                self._start_locked()
        return lease

    def release(self, lease: Lease, *, cancelled: bool) -> None:
        """End a lease: its reservation is returned now; with `cancelled`, its waiting work
        fails and its sessions are freed at the next engine step (by the engine thread)."""
        with self._cond:
            if cancelled and not lease.closed and not lease.cancelled:
                lease.cancelled = True
                self._stats["cancelled"] += 1
            if lease in self._leases:
                self._leases.discard(lease)
                self.admission.unreserve(lease.kv_bytes)
            lease.closed = True
            self._awaiting.discard(lease)
            self._cond.notify_all()

    @contextmanager
    def session(self, **options: Any) -> Iterator[BatchedSession]:
        """One batched session under a lease of its own (`with scheduler.session() as s`)."""
        with self.lease(wait=True) as lease:
            yield lease.model.session(**options)

    # -- requests' side --------------------------------------------------------------------
    def submit(self, lease: Lease, work: Work) -> Any:
        """Queue `work` and block until an engine step has run it; its result, or its error."""
        with self._cond:
            lease.check()
            self._queue.append(work)
            self._awaiting.discard(lease)
            self._last_arrival = time.monotonic()
            self._cond.notify_all()
        work.done.wait()
        if work.error is not None:
            raise work.error
        return work.result

    # -- the engine thread -------------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            self._start_locked()

    def _start_locked(self) -> None:
        if not self._threads and not self.stopped:
            self._threads = [threading.Thread(target=self._loop, daemon=True,
                                              name=f"needlepoint-scheduler{k or ''}")
                             for k in range(self.loops)]
            self._thread = self._threads[0]
            for thread in self._threads:
                thread.start()

    def close(self) -> None:
        """Stop the engine thread; work still waiting fails with SchedulerClosed."""
        with self._cond:
            self.stopped = True
            self._cond.notify_all()
            threads = list(self._threads)
        self.admission.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=30)
        self._fail_all(SchedulerClosed("the scheduler was shut down"))

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            queue, self._queue = self._queue, []
        for work in queue:
            work.finish(error=error)

    def _loop(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                self._run(*batch)
                del batch  # no reference to a finished request's session while waiting
        except BaseException as error:  # noqa: BLE001 - a bug: fail the waiters, not hang them
            with self._cond:
                self.stopped = True
                self._cond.notify_all()
            self._fail_all(error)
            raise

    def _next_batch(self) -> tuple[list[Work], list[tuple[Work, int]]] | None:
        """Wait for work, gather, and take the next step's (calls, [(work, tokens)])."""
        with self._cond:
            while True:
                if self.stopped:
                    return None
                self._drop_cancelled()
                if any(id(w) not in self._in_flight for w in self._queue):
                    break
                self._cond.wait()
            self._gather()
            self._drop_cancelled()
            free = [w for w in self._queue if id(w) not in self._in_flight]
            calls = [w for w in free if w.call is not None]
            pending = [w for w in free if w.call is None]
            if self.loops > 1:  # this loop's share: the others keep the pipeline full
                pending = pending[: max(1, -(-len(self._leases) // self.loops))]
            plan = plan_step(pending, self.step_tokens, self.new_first and not self._new_only)
            self._in_flight.update(id(w) for w in calls + [w for w, _ in plan])
            # a step of new prompts only is followed by one that decodes (no starvation)
            self._new_only = bool(plan) and len(plan) < len(pending) and \
                all(w.fed == 0 and w.remaining > 1 for w, _ in plan)
            return calls, plan

    def _gather(self) -> None:
        """Wait (bounded) for the requests answered last step to come back with work."""
        cap = time.monotonic() + self.max_gather_s
        while self._awaiting and not self.stopped:
            now = time.monotonic()
            left = min(self._last_arrival + self.gather_s, cap) - now
            if left <= 0:
                break
            self._cond.wait(left)
        self._awaiting.clear()

    def _drop_cancelled(self) -> None:
        keep = []
        for work in self._queue:
            lease = work.proxy.lease
            if (lease.cancelled or self.stopped) and id(work) not in self._in_flight:
                work.proxy.free()  # the KV cache goes with the last reference
                work.finish(error=RequestCancelled("the request was cancelled"))
            else:
                keep.append(work)
        self._queue = keep

    def _run(self, calls: list[Work], plan: list[tuple[Work, int]]) -> None:
        taken = [id(w) for w in calls] + [id(w) for w, _ in plan]  # in flight until the end
        done: list[tuple[Work, Any, BaseException | None]] = []  # handed out under the lock
        for work in calls + [w for w, _ in plan]:
            if work.rewind:  # a rewind the request made since its last work
                try:
                    work.proxy.session.rewind(work.rewind)
                except Exception as error:  # noqa: BLE001 - the request's own failure
                    done.append((work, None, error))
                work.rewind = 0
        failed = {id(w) for w, _, _ in done}
        calls = [w for w in calls if id(w) not in failed]
        plan = [(w, n) for w, n in plan if id(w) not in failed]
        for work in calls:
            try:
                done.append((work, work.call(work.proxy.session), None))
            except Exception as error:  # noqa: BLE001 - the request's own failure
                done.append((work, None, error))
        items = [(w.proxy.session, w.ids[w.fed : w.fed + n], w.all_logits,
                  w.want and w.fed + n == len(w.ids) or w.all_logits) for w, n in plan]
        error: BaseException | None = None
        outputs: list[Any] = [None] * len(plan)
        decoding = sum(1 for w, _ in plan if w.decode_like)  # sessions this step brings a token
        if items:
            try:
                outputs = run_batch(self.model, items, self.batched)
            except Exception as failure:  # noqa: BLE001 - reported to every request in it
                error = failure
        if decoding and error is None and self.batched:  # a draft row's cost to the step
            policy_for(self.model).batched(decoding, sum(n for _, n in plan))
        for (work, n), logits in zip(plan, outputs, strict=True):
            if error is not None:
                done.append((work, None, error))
                continue
            work.fed += n
            if work.all_logits:
                work.parts.append(logits)
            if work.remaining == 0:
                result = np.concatenate(work.parts) if work.all_logits else logits
                done.append((work, result, None))
        with self._cond:
            # Awaited before they are answered: an answered request may submit at once.
            self._awaiting.update(w.proxy.lease for w, _, _ in done
                                  if w.proxy.lease in self._leases)
            finished = {id(w) for w, _, _ in done}
            self._queue = [w for w in self._queue if id(w) not in finished]
            self._in_flight.difference_update(taken)
            self._cond.notify_all()  # work this step held may be free for another loop
            self._last_arrival = time.monotonic()
            self._record(plan, calls)
            for work, result, failure in done:
                work.finish(result=result, error=failure)

    def _record(self, plan: list[tuple[Work, int]], calls: list[Work]) -> None:
        stats = self._stats
        stats["calls"] += len(calls)
        if not plan:
            return
        stats["steps"] += 1  # engine steps that ran the model
        stats["rows"] += sum(n for _, n in plan)

        stats["sessions_stepped"] += len(plan)
        stats["max_batch"] = max(stats["max_batch"], len(plan))
        if self.step_log is not None:
            self.step_log.append([(w.proxy.lease.number, n) for w, n in plan])

    def stats(self) -> dict[str, Any]:
        """Counters for /health and benchmarks (steps, rows, sessions per step, caps)."""
        admitted = self.admission.stats()
        with self._cond:
            stats = dict(self._stats)
            stats.update(live_sessions=len(self._leases), max_sessions=self.max_sessions,
                         kv_bytes_reserved=admitted["kv_bytes_reserved"],
                         max_kv_bytes=self.max_kv_bytes, refused=admitted["refused"],
                         session_kv_bytes=self.session_kv_bytes, batched=self.batched,
                         step_tokens=self.step_tokens, pending=len(self._queue))
        return stats
