"""Prometheus metrics of one app (`GET /metrics`, text format, `prometheus_client`).

Every app has its own `CollectorRegistry` (never the library's global one), so two servers in
one process count separately. Three sources feed it:

* the HTTP middleware (`server/observe.py`): requests by route, method and status, and each
  request's latency (until its last byte, streams included);
* the jobs (`Metrics.chat_stream`, `chat_run`, `native_run` wrap them in `app.py`): prompt and
  completion tokens, time to first token, speculative drafts and acceptances per source;
* a collector that reads the worker pool and the batching scheduler when scraped: requests in
  flight, queue depth, live sessions, KV bytes, engine steps and sessions stepped, and the C
  heap's bytes in use and held free (`memory.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as _generate
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..stages.model import StagedModel
from .concurrency import WorkerPool
from .engine import ChatJob, ChatResult, Delta, NativeJob
from .memory import heap_stats

PREFIX = "needlepoint"
# Seconds; the toy model answers in milliseconds, the shipped one on a busy CPU in seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0)
SPEC_SOURCES_SUFFIX = ("_drafted", "_accepted")


class Metrics:
    """The registry of one app and the metrics recorded into it."""

    def __init__(self, pool: Any, scheduler: Any = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_http_requests", "HTTP requests answered, by route "
                                "(the route's path template), method and status code",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram(f"{PREFIX}_http_request_duration_seconds", "Time from a "
                                 "request's arrival to its response's last byte",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Time from a chat "
                              "request being accepted to its first decoded token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of the "
                                     "answered requests", registry=r)
        self.completion_tokens = Counter(f"{PREFIX}_completion_tokens", "Tokens generated "
                                         "for the answered requests", registry=r)
        self.answers = Counter(f"{PREFIX}_answers", "Model answers completed, by endpoint "
                               "and finish reason", ["endpoint", "finish_reason"], registry=r)
        self.failed = Counter(f"{PREFIX}_answers_failed", "Model answers that ended in an "
                              "error (a streamed one after its 200: reported in-band), by "
                              "endpoint and error class", ["endpoint", "error"], registry=r)
        self.decode_passes = Counter(f"{PREFIX}_decode_passes", "Forward passes after the "
                                     "prefill (fewer than the tokens when drafts are accepted)",
                                     registry=r)
        self.drafted = Counter(f"{PREFIX}_speculative_drafted_tokens", "Draft tokens proposed "
                               "for verification, by draft source", ["source"], registry=r)
        self.accepted = Counter(f"{PREFIX}_speculative_accepted_tokens", "Draft tokens the "
                                "model agreed with, by draft source", ["source"], registry=r)
        r.register(LiveCollector(pool, scheduler))

    # -- the text format -------------------------------------------------------------------
    content_type = CONTENT_TYPE_LATEST

    def render(self) -> bytes:
        return _generate(self.registry)

    # -- HTTP (called by the middleware) ---------------------------------------------------
    def observe_http(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    # -- jobs ------------------------------------------------------------------------------
    def record_envelope(self, endpoint: str, prompt_tokens: int, completion_tokens: int,
                        finish_reason: str, envelope: dict[str, Any]) -> None:
        self.prompt_tokens.inc(max(0, prompt_tokens))
        self.completion_tokens.inc(max(0, completion_tokens))
        self.answers.labels(endpoint, finish_reason).inc()
        timings = envelope.get("timings", {})
        self.decode_passes.inc(max(0, int(timings.get("decode_passes", 0))))
        for key, value in timings.items():
            for suffix, counter in zip(SPEC_SOURCES_SUFFIX, (self.drafted, self.accepted),
                                       strict=True):
                if key.endswith(suffix) and key != suffix and int(value) >= 0:
                    counter.labels(key[: -len(suffix)]).inc(int(value))

    def chat_stream(self, job: ChatJob) -> Callable[[], Iterator[Delta | ChatResult]]:
        """`job.stream`, observed: the first token's time and, at the end, the counts."""
        start = time.perf_counter()

        def observed() -> Iterator[Delta | ChatResult]:
            inner = job.stream()
            first = True
            try:
                for item in inner:
                    if isinstance(item, ChatResult):
                        if first:  # an empty answer: its first token is its end
                            self.ttft.observe(time.perf_counter() - start)
                            first = False
                        self.record_envelope("chat", item.prompt_tokens,
                                             item.completion_tokens, item.finish_reason,
                                             item.envelope)
                    elif first and (item.content or item.reasoning or item.call_text):
                        self.ttft.observe(time.perf_counter() - start)
                        first = False
                    yield item
            except Exception as error:
                self.failed.labels("chat", type(error).__name__).inc()
                raise
            finally:
                inner.close()  # a cancelled stream ends its job (and lease) now

        return observed

    def chat_run(self, job: ChatJob) -> Callable[[], ChatResult]:
        """`job.run`, observed (it consumes the observed stream)."""
        stream = self.chat_stream(job)

        def run() -> ChatResult:
            items = stream()
            try:
                for item in items:
                    if isinstance(item, ChatResult):
                        return item
            finally:
                # closed here, not when the generator is freed: anything else holding it (a
                # traceback, a debugger, gc.get_objects) would keep the job's lease alive
                # after its worker is free, and the next job would find the scheduler full
                items.close()
            raise RuntimeError("the generator ended without a result")  # pragma: no cover

        return run

    def native_run(self, job: NativeJob) -> Callable[[], dict[str, Any]]:
        """`job.run` of `/v1/needlepoint/complete`, counted (not streamed: no first token)."""

        def run() -> dict[str, Any]:
            try:
                envelope = job.run()
            except Exception as error:
                self.failed.labels("native", type(error).__name__).inc()
                raise
            timings = envelope.get("timings", {})
            self.record_envelope("native", int(timings.get("prefill_tokens", 0)),
                                 int(timings.get("decode_tokens", 0)),
                                 str(envelope.get("stop_reason") or "stop"), envelope)
            return envelope

        return run


class LiveCollector(Collector):
    """Reads the pool's and the scheduler's state at scrape time (nothing is copied)."""

    def __init__(self, pool: Any, scheduler: Any = None) -> None:
        self.pool = pool
        self.scheduler = scheduler

    def collect(self) -> Iterator[Any]:
        pool = self.pool.stats()
        in_flight, workers = pool["in_flight"], pool["workers"]
        yield _gauge("requests_in_flight", "Requests admitted (running or queued)", in_flight)
        yield _gauge("queue_depth", "Admitted requests waiting for a worker",
                     max(0, in_flight - workers))
        yield _gauge("queue_capacity", "Requests that may wait before a 429", pool["max_queue"])
        yield from _heap(self.pool)
        if self.scheduler is None:
            yield _gauge("live_sessions", "Requests decoding now (each its own session)",
                         min(in_flight, workers))
            return
        s = self.scheduler.stats()
        for make, name, doc, key in SCHEDULER_METRICS:
            yield make(name, doc, s[key])
        mean = s["sessions_stepped"] / s["steps"] if s["steps"] else 0.0
        yield _gauge("engine_sessions_per_step", "Mean sessions per engine step so far", mean)


def stage_health(model: Any) -> dict[str, Any] | None:
    """A staged model's losses and replays (`StagedModel.stage_health`), else None."""
    return model.stage_health() if isinstance(model, StagedModel) else None


class StageCollector(Collector):
    """A model cut into stages: stage losses, sessions replayed, stages recovering now
    (docs/distributed.md, "A stage lost mid-request")."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def collect(self) -> Iterator[Any]:
        h = stage_health(self.model) or {}
        yield _counter("stage_losses", "Stage processes lost (died or silent) and noticed",
                       h.get("losses", 0))
        yield _counter("stage_recoveries", "Stage losses survived (stage back, sessions "
                       "replayed, the call re-issued)", h.get("recoveries", 0))
        yield _counter("stage_replays", "Sessions replayed into a restarted stage",
                       h.get("replays", 0))
        yield _counter("stage_replayed_tokens", "Tokens re-run by the replays",
                       h.get("replayed_tokens", 0))
        yield _counter("stage_recovery_failures", "Stage losses that failed their request "
                       "(bound reached, or no stage back in time)", h.get("failures", 0))
        yield _gauge("stages_recovering", "Stages being recovered now (health: degraded)",
                     len(h.get("recovering", ())))


def _heap(pool: WorkerPool) -> Iterator[Any]:
    """The C heap (glibc `mallinfo2`, `memory.py`): bytes in use vs held free, and trims."""
    heap = heap_stats()
    if heap is not None:
        yield _gauge("heap_in_use_bytes", "C heap bytes allocated (glibc mallinfo2)",
                     heap["in_use"])
        yield _gauge("heap_free_bytes", "C heap bytes held free in the arenas (glibc "
                     "mallinfo2)", heap["free"])
    trimmer = pool.trimmer
    if trimmer is not None:
        yield _counter("heap_trims", "malloc_trim calls (one per TRIM_EVERY finished jobs)",
                       trimmer.trims)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def install_metrics(app: Any, metrics: Metrics) -> None:
    """`GET /metrics`: the app's registry in Prometheus' text format (open, like /health)."""
    from fastapi.responses import Response

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)


# The scheduler's stats exported one to one: (kind, metric name, help, `stats()` key).
SCHEDULER_METRICS = (
    (_gauge, "live_sessions", "Scheduler sessions live (requests decoding)", "live_sessions"),
    (_gauge, "max_sessions", "Most scheduler sessions live at once", "max_sessions"),
    (_gauge, "kv_bytes", "KV cache bytes reserved by the live sessions (at full capacity)",
     "kv_bytes_reserved"),
    (_gauge, "kv_bytes_limit", "Cap on the live sessions' KV bytes", "max_kv_bytes"),
    (_gauge, "engine_pending_work", "Work items waiting for the next engine step", "pending"),
    (_counter, "engine_steps", "Engine steps that ran the model", "steps"),
    (_counter, "engine_step_sessions", "Sessions run, summed over engine steps "
     "(divided by engine_steps: sessions per step)", "sessions_stepped"),
    (_counter, "engine_step_rows", "Token rows run, summed over engine steps", "rows"),
    (_gauge, "engine_max_sessions_per_step", "Most sessions in one engine step", "max_batch"),
)
