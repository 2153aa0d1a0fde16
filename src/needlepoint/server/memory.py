"""The server's C heap: fewer glibc arenas, free pages handed back, heap figures for /metrics.

Measured under `needlepoint-bench-load` (docs/benchmarks_server.md, notes): the Python objects
and the bytes glibc reports in use stay flat under load, while the RSS of a long run crept up
with the bytes glibc holds *free*. Every request allocates its session's KV and history
arrays (most of them blocks under glibc's mmap threshold, so from the heap) and every engine
step its batch temporaries, on ~35 threads; glibc gives threads up to 8 arenas per core, and
the free blocks scattered over those heaps are kept (fragmentation), not returned. Two
remedies, both only on glibc (a no-op elsewhere, or without ctypes):

* `limit_arenas`: at most `ARENA_MAX` arenas (`mallopt(M_ARENA_MAX)`, what the environment
  variable `MALLOC_ARENA_MAX` sets; an explicit `MALLOC_ARENA_MAX` wins), called before the
  server starts its threads;
* `HeapTrimmer`: `malloc_trim(0)` (returns the free pages of every arena to the system)
  after every `TRIM_EVERY` finished jobs, on the worker thread that finished the last one.

`heap_stats` reads `mallinfo2` (glibc >= 2.33) for the metrics collector.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

ARENA_MAX = 2  # glibc's default would be 8 per core
TRIM_EVERY = 64  # finished jobs between two malloc_trim(0) calls
M_ARENA_MAX = -8  # <malloc.h>


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def glibc() -> Any:
    """The C library when it is glibc (has `malloc_trim`), else None."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def limit_arenas(libc: Any = None, arenas: int = ARENA_MAX) -> bool:
    """Cap glibc's arenas at `arenas` unless `$MALLOC_ARENA_MAX` is set; True when applied.
    Takes effect for threads that have not allocated yet: call it before they start."""
    libc = glibc() if libc is None else libc
    if libc is None or os.environ.get("MALLOC_ARENA_MAX") or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))


def heap_stats(libc: Any = None) -> dict[str, int] | None:
    """glibc's heap figures in bytes: `in_use` (allocated blocks), `free` (held free in the
    arenas), `arena` (the arenas' size), `mmapped` (large blocks mapped on their own); None
    without glibc's `mallinfo2`."""
    libc = glibc() if libc is None else libc
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return {"in_use": info.uordblks, "free": info.fordblks, "arena": info.arena,
            "mmapped": info.hblkhd}


class HeapTrimmer:
    """`done()` after each finished job; every `every`-th call runs `malloc_trim(0)`."""

    def __init__(self, every: int = TRIM_EVERY, libc: Any = None) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.libc = glibc() if libc is None else libc
        self.jobs = 0
        self.trims = 0
        self._lock = threading.Lock()

    def done(self) -> None:
        if self.libc is None:
            return
        with self._lock:
            self.jobs += 1
            due = self.jobs % self.every == 0
            if due:
                self.trims += 1
        if due:
            self.libc.malloc_trim(0)
