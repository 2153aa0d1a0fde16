"""Memory under load: requests leave nothing behind, and the C heap is trimmed.

A soak of `needlepoint serve` (docs/benchmarks_server.md) showed RSS creeping up while the
Python objects and glibc's bytes in use stayed flat: free heap memory kept by glibc's many
per-thread arenas. `server/memory.py` caps the arenas and calls `malloc_trim(0)` after every
`TRIM_EVERY` finished jobs. These tests count, they do not time: the same requests run
twice after a warm-up, and what is still allocated afterwards must not grow with the number
of requests (a per-request leak of any object, or of a session's ~0.5 MB of KV arrays,
would exceed the bounds many times over).
"""

# ruff: noqa: F811

from __future__ import annotations

import gc
import threading
import tracemalloc
import weakref
from typing import Any

import httpx
import pytest
from server_helpers import (  # noqa: F401 (fixtures, requested by name)
    ServerThread,
    ask,
    collect_stream,
    examples,
    model,
)

from needlepoint.server import create_app
from needlepoint.server.concurrency import WorkerPool
from needlepoint.server.engine import ChatResult
from needlepoint.server.memory import (
    ARENA_MAX,
    M_ARENA_MAX,
    HeapTrimmer,
    glibc,
    heap_stats,
    limit_arenas,
)
from needlepoint.server.metrics import Metrics

# asyncio keeps a cancelled timer (the body-read deadline, uvicorn's keep-alive; each with
# its Context) in the loop's heap until it is due or until over 100 are cancelled: bounded
# by asyncio, not by the request count.
ASYNCIO_PENDING = {"TimerHandle", "Context"}
ROUND = 48  # requests per measured round (8 examples x 6, every 4th streamed)
PER_REQUEST_BYTES = 2048  # allowed traced growth per request between the rounds


class FakeLibc:
    """Records the allocator calls a `HeapTrimmer` / `limit_arenas` makes."""

    def __init__(self) -> None:
        self.trims: list[int] = []
        self.options: list[tuple[int, int]] = []

    def malloc_trim(self, pad: int) -> int:
        self.trims.append(pad)
        return 1

    def mallopt(self, option: int, value: int) -> int:
        self.options.append((option, value))
        return 1


def _round(client: Any, examples: list[dict[str, Any]]) -> None:
    for i in range(ROUND):
        example = examples[i % 8]
        if i % 4 == 3:
            collect_stream(ask(client, example, stream=True))
        else:
            ask(client, example)


def _kind(obj: object) -> str:
    """An object's type, with what a weak reference points to or whose method it is."""
    if type(obj) is weakref.ReferenceType:  # not isinstance: it would load lazy proxies
        target = obj()
        name = target.__qualname__ if type(target) is type else type(target).__name__
        return f"weakref to {name}"
    if type(obj).__name__ == "builtin_function_or_method":
        return f"method of {type(obj.__self__).__name__}"  # type: ignore[attr-defined]
    return type(obj).__name__


def _live_types() -> dict[str, int]:
    """Live gc-tracked objects by kind (counted by hand: `Counter(generator)` would itself
    fill the ABC caches of every Mapping subclass with weak references)."""
    gc.collect()
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        kind = _kind(obj)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _traced_bytes() -> int:
    """Bytes traced now, less what this file allocated (the counts it keeps)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, __file__), tracemalloc.Filter(False, tracemalloc.__file__)])
    return sum(stat.size for stat in snapshot.statistics("filename"))


def test_requests_leave_nothing_behind(model: Any, examples: list[dict[str, Any]]) -> None:
    app = create_app(model, workers=4, max_queue=8, model_name="needle3-toy")
    scheduler = app.state.engine.scheduler
    assert scheduler is not None  # batching is the default
    with ServerThread(app) as server:
        client = server.client()
        _round(client, examples)  # warm-up: grammars, vocab, metrics children, pools
        tracemalloc.start()
        try:
            _round(client, examples)
            types_before = _live_types()
            traced_before = _traced_bytes()
            _round(client, examples)
            _round(client, examples)
            types_after = _live_types()
            traced_after = _traced_bytes()
        finally:
            tracemalloc.stop()
        health = server.health()
    grown = {name: count - types_before.get(name, 0) for name, count in types_after.items()
             if count - types_before.get(name, 0) >= ROUND and name not in ASYNCIO_PENDING}
    assert grown == {}, f"objects that grew with the requests: {grown}"
    per_request = (traced_after - traced_before) / (2 * ROUND)
    assert per_request < PER_REQUEST_BYTES, f"{per_request:.0f} bytes kept per request"
    assert health["in_flight"] == 0
    assert scheduler.stats()["live_sessions"] == 0


def test_trimmer_trims_every_nth_job_from_any_thread() -> None:
    libc = FakeLibc()
    trimmer = HeapTrimmer(every=10, libc=libc)
    threads = [threading.Thread(target=lambda: [trimmer.done() for _ in range(25)])
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert trimmer.jobs == 100
    assert trimmer.trims == 10 and libc.trims == [0] * 10
    with pytest.raises(ValueError):
        HeapTrimmer(every=0, libc=libc)


def test_pool_tells_the_trimmer_of_every_finished_job() -> None:
    libc = FakeLibc()
    pool = WorkerPool(2, 4, trimmer=HeapTrimmer(every=3, libc=libc))
    futures = [pool.submit(pool.admit(), lambda: None) for _ in range(3)]
    failing = pool.submit(pool.admit(), lambda: 1 / 0)  # a failed job counts too
    for future in futures:
        future.result(timeout=30)
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=30)
    assert pool.trimmer.jobs == 4 and libc.trims == [0]


def test_limit_arenas_sets_the_cap_unless_the_environment_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc()
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_arenas(libc) is True
    assert libc.options == [(M_ARENA_MAX, ARENA_MAX)]
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas(libc) is False
    assert libc.options == [(M_ARENA_MAX, ARENA_MAX)]


def test_heap_figures_on_metrics_and_trims_counted(model: Any,
                                                   examples: list[dict[str, Any]]) -> None:
    assert glibc() is not None  # Linux with glibc, as CI (elsewhere memory.py does nothing)
    stats = heap_stats()
    assert stats is not None and stats["in_use"] > 0 and stats["free"] >= 0
    app = create_app(model, workers=2, max_queue=8, model_name="needle3-toy")
    with ServerThread(app) as server:
        client = server.client()
        for i in range(64):  # TRIM_EVERY jobs: one trim
            ask(client, examples[i % 8])
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines()
                 if line.startswith("needlepoint_heap"))
    assert float(lines["needlepoint_heap_in_use_bytes"]) > 0
    assert float(lines["needlepoint_heap_free_bytes"]) >= 0
    assert float(lines["needlepoint_heap_trims_total"]) == 1.0


class _Job:
    """A chat job whose stream ends with a result and records when it is closed (where the
    real job closes its scheduler lease)."""

    def __init__(self) -> None:
        self.closed = False

    def stream(self) -> Any:
        try:
            yield ChatResult(content="hi", reasoning="", calls=[], finish_reason="stop",
                             prompt_tokens=3, completion_tokens=1, envelope={})
            yield ChatResult(content="never", reasoning="", calls=[], finish_reason="stop",
                             prompt_tokens=3, completion_tokens=1, envelope={})
        finally:
            self.closed = True


def test_a_plain_job_ends_its_stream_when_it_returns() -> None:
    """Its lease must not wait for the generator to be freed: something else holding it (here
    a list, in the soak a diagnostic's gc.get_objects) kept the lease, and the next job on
    the freed worker got a 429 from a full scheduler."""
    metrics = Metrics(WorkerPool(1, 0, trimmer=HeapTrimmer(libc=FakeLibc())))
    held: list[Any] = []
    observed = metrics.chat_stream

    def holding(job: Any) -> Any:
        make = observed(job)

        def make_and_hold() -> Any:
            held.append(make())
            return held[-1]

        return make_and_hold

    metrics.chat_stream = holding  # type: ignore[method-assign]
    job = _Job()
    result = metrics.chat_run(job)()
    assert result.content == "hi"
    assert held and job.closed


def test_invented_methods_do_not_grow_the_metric_labels(model: Any) -> None:
    app = create_app(model, workers=1, max_queue=1, model_name="needle3-toy")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        statuses = {http.request(f"X{k}", "/v1/models").status_code for k in range(40)}
        text = http.get("/metrics").text
    assert statuses == {405}
    methods = {line.split('method="', 1)[1].split('"', 1)[0] for line in text.splitlines()
               if line.startswith("needlepoint_http_requests_total{")}
    assert methods == {"(other)"}  # (the GET of /metrics is counted once it has answered)
