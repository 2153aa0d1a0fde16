"""Admission: the one rule for how many requests a served model takes, in one place.

    admission = Admission(4, max_queue=8, kv_bytes=per_session, max_kv_bytes=1 << 30)
    ticket = admission.admit()       # a place: running or waiting (AdmissionFull past 4 + 8)
    kv = admission.reserve()         # a running request's session (AdmissionFull past 4 live
    ...                              # sessions or the KV budget); wait=True blocks instead
    admission.unreserve(kv); ticket.release()

Two counts, one object: *places* (`admit`) are the requests admitted at all, running or
waiting for a worker, at most `running + max_queue`; *reservations* (`reserve`) are the
requests running on a session, at most `running` of them, each reserving `kv_bytes` of KV
cache (one session's at full capacity) out of `max_kv_bytes`. The continuous-batching
scheduler (`scheduler.py`) reserves for each lease; the server's worker pool
(`server/concurrency.py`) takes a place for each request; both read this object, so the
server's queue limit, session cap and KV budget, and what is refused past them (AdmissionFull,
HTTP 429), are decided here and nowhere else.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..errors import NeedlepointError

__all__ = ["Admission", "AdmissionClosed", "AdmissionFull", "Ticket"]


class AdmissionFull(NeedlepointError):
    """No room for another request: the queue, the live-session or the KV-bytes cap is
    reached (the server answers 429)."""


class AdmissionClosed(NeedlepointError):
    """The model's admission was closed (shutting down) while a request waited for room."""


class Ticket:
    """One admitted request's place; `release` is idempotent (several paths may end a job)."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._admission.leave()


class Admission:
    """Places and session reservations of one model's requests (see the module doc).
    `max_kv_bytes=None` is `running` sessions' worth of `kv_bytes`."""

    def __init__(self, running: int, max_queue: int = 0, *, kv_bytes: int = 0,
                 max_kv_bytes: int | None = None) -> None:
        if running < 1:
            raise ValueError(f"running must be >= 1, got {running}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.running = running
        self.max_queue = max_queue
        self.capacity = running + max_queue
        self.kv_bytes = int(kv_bytes)
        self.max_kv_bytes = running * self.kv_bytes if max_kv_bytes is None \
            else int(max_kv_bytes)
        self.closed = False
        self._cond = threading.Condition()
        self._admitted = self._peak = 0  # places
        self._live = self._reserved = self._refused = 0  # reservations

    # -- places ------------------------------------------------------------------------------
    def admit(self) -> Ticket:
        """A place for one request, or AdmissionFull when `capacity` are admitted."""
        with self._cond:
            if self._admitted >= self.capacity:
                raise AdmissionFull(f"{self.capacity} requests are already running or queued")
            self._admitted += 1
            self._peak = max(self._peak, self._admitted)
        return Ticket(self)

    def leave(self) -> None:
        """A place is given back (`Ticket.release`)."""
        with self._cond:
            self._admitted -= 1

    # -- reservations ------------------------------------------------------------------------
    def reserve(self, *, wait: bool = False, timeout: float | None = None) -> int:
        """Room for one running request's session: the KV bytes reserved, or AdmissionFull
        when `running` are live or the KV budget is spent (with `wait=True`: blocks until
        there is room, AdmissionFull after `timeout` seconds; AdmissionClosed if closed)."""
        need = self.kv_bytes
        if need > self.max_kv_bytes:
            raise AdmissionFull(f"one session needs {need} KV bytes, over the cap of "
                                f"{self.max_kv_bytes}")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._full(need):
                if self.closed:
                    raise AdmissionClosed("the model's admission is closed")
                left = None if deadline is None else deadline - time.monotonic()
                if not wait or (left is not None and left <= 0):
                    self._refused += 1
                    raise AdmissionFull(
                        f"no session is free: {self._live} of {self.running} sessions live, "
                        f"{self._reserved} of {self.max_kv_bytes} KV bytes reserved")
                self._cond.wait(left)
            if self.closed:
                raise AdmissionClosed("the model's admission is closed")
            self._live += 1
            self._reserved += need
        return need

    def _full(self, need: int) -> bool:
        return self._live >= self.running or self._reserved + need > self.max_kv_bytes

    def unreserve(self, kv_bytes: int) -> None:
        """A running request's session is given back (its `reserve` result)."""
        with self._cond:
            self._live -= 1
            self._reserved -= kv_bytes
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse every waiting and later reservation (AdmissionClosed)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        """Places (`in_flight`, `peak_in_flight`, the caps) and reservations."""
        with self._cond:
            return {"running": self.running, "max_queue": self.max_queue,
                    "in_flight": self._admitted, "peak_in_flight": self._peak,
                    "live_sessions": self._live, "kv_bytes_reserved": self._reserved,
                    "max_kv_bytes": self.max_kv_bytes, "session_kv_bytes": self.kv_bytes,
                    "refused": self._refused}
