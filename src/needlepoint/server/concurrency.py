"""Bounded parallelism: a fixed thread pool for model work plus admission control.

Model work is numpy: its matmuls release the GIL, so N threads give real parallelism without
N copies of the weights (processes would each map and dequantise their own). The event loop
never runs model code; it only admits, waits and writes bytes.

Admission is decided by the app's one `api.admission.Admission` (the scheduler's, with
continuous batching), which this pool consumes: a request takes a place there before its work
is submitted and gives it back when the work has *finished on its thread* (or was cancelled
before it started). Releasing when the HTTP side gives up instead would let abandoned work
pile up behind the workers while new requests are admitted, so the bound would not bound
anything. `workers + max_queue` places exist; past that the admission refuses
(`AdmissionFull`, a 429).

With continuous batching (`api/scheduler.py`) the workers are the requests decoded at once:
each running job holds one scheduler session, samples on its worker thread and waits for
the scheduler's engine step to run the model for all of them. A client that goes away
(a closed stream, or a disconnect while a plain request runs) cancels its job, which frees
its session at the next engine step and its worker soon after.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from ..api.admission import Admission, Ticket
from .memory import HeapTrimmer

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected while its plain (non-streamed) request ran."""


class WorkerPool:
    def __init__(self, workers: int, max_queue: int = 0, trimmer: HeapTrimmer | None = None,
                 admission: Admission | None = None) -> None:
        """`workers` threads; places from `admission` (default: one of `workers` running and
        `max_queue` waiting); `trimmer`: told of every finished job (`memory.py`; default: a
        `HeapTrimmer`)."""
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.admission = Admission(workers, max_queue) if admission is None else admission
        self.workers = workers
        self.max_queue = self.admission.max_queue
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="needlepoint-worker")
        self.trimmer = HeapTrimmer() if trimmer is None else trimmer

    # -- admission ----------------------------------------------------------------------------
    def admit(self) -> Ticket:
        """A place for one request (`AdmissionFull`, a 429, when there is none)."""
        return self.admission.admit()

    def stats(self) -> dict[str, int]:
        admitted = self.admission.stats()
        return {
            "workers": self.workers,
            "max_queue": self.max_queue,
            "in_flight": admitted["in_flight"],
            "peak_in_flight": admitted["peak_in_flight"],
        }

    # -- execution ----------------------------------------------------------------------------
    def submit(self, ticket: Ticket, fn: Callable[[], T]) -> Future[T]:
        def job() -> T:
            try:
                return fn()
            finally:
                ticket.release()
                self.trimmer.done()

        return self._executor.submit(job)

    async def run(self, ticket: Ticket, fn: Callable[[], T], *,
                  cancel: Callable[[], None] | None = None,
                  gone: Awaitable[Any] | None = None) -> T:
        """Run `fn` on a worker; awaitable from the event loop. When `gone` (an awaitable
        that ends when the client disconnects) finishes first, `cancel()` stops the job and
        `ClientGone` is raised (nobody is left to answer)."""
        future = self.submit(ticket, fn)
        waiter = asyncio.wrap_future(future)
        watcher = asyncio.ensure_future(gone) if gone is not None else None
        try:
            if watcher is None:
                return await waiter
            await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                return waiter.result()
            future.cancel()
            if cancel is not None:
                cancel()
            waiter.cancel()
            raise ClientGone("the client disconnected before the answer was ready")
        finally:
            if watcher is not None:
                watcher.cancel()
            # wrap_future cancels `future` if we were cancelled; a job that never started
            # never reaches its own `finally`, so its slot is returned here.
            if future.cancelled():
                ticket.release()

    def stream(self, ticket: Ticket, make_iter: Callable[[], Iterator[T]],
               cancel: Callable[[], None] | None = None) -> EventPump[T]:
        return EventPump(self, ticket, make_iter, cancel)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class EventPump(Generic[T]):
    """Drives a blocking iterator on a worker thread and hands its items to the event loop.

    The iterator is created *on the worker* (creating it may already do model work). Items
    cross threads through `call_soon_threadsafe` into an asyncio queue, so each one reaches
    the client as soon as it is decoded. `cancel()` (client gone) makes the worker stop at
    the next item and close the iterator, which frees the worker for queued requests.
    """

    _ITEM, _END, _ERROR = 0, 1, 2

    def __init__(self, pool: WorkerPool, ticket: Ticket, make_iter: Callable[[], Iterator[T]],
                 on_cancel: Callable[[], None] | None = None):
        self._pool = pool
        self._ticket = ticket
        self._make_iter = make_iter
        self._on_cancel = on_cancel
        self._ended = False  # the end (or the error) reached the event loop
        self._stop = threading.Event()
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._future = pool.submit(ticket, self._pump)

    def _put(self, kind: int, value: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (kind, value))
            return True
        except RuntimeError:  # the loop is closed: the server is shutting down
            self._stop.set()
            return False

    def _pump(self) -> None:
        iterator: Iterator[T] | None = None
        try:
            iterator = self._make_iter()
            for item in iterator:
                if self._stop.is_set() or not self._put(self._ITEM, item):
                    return
            self._put(self._END, None)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop, re-raised there
            self._put(self._ERROR, exc)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    async def next(self) -> tuple[bool, T | None]:
        """(True, item) or (False, None) at the end; re-raises the iterator's exception."""
        kind, value = await self._queue.get()
        if kind == self._ITEM:
            return True, value
        self._ended = True
        if kind == self._ERROR:
            raise value
        return False, None

    async def items(self) -> AsyncIterator[T]:
        while True:
            more, item = await self.next()
            if not more:
                return
            yield item  # type: ignore[misc]

    def cancel(self) -> None:
        """Stop the work (idempotent; a finished job is not affected): a job that never
        started gives its slot back now; a running one is cancelled (its scheduler session
        freed at the next engine step) and ends at its next item."""
        self._stop.set()
        if self._future.cancel():  # never started: its own finally will not run
            self._ticket.release()
        elif self._on_cancel is not None and not self._ended and not self._future.done():
            self._on_cancel()
