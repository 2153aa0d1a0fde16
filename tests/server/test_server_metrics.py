"""`GET /metrics` (`server/metrics.py`) and `x-request-id` (`server/observe.py`): requests are
driven through the official client, then the Prometheus text is parsed (prometheus_client's
own parser) and its counts checked against what the responses said."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import (  # noqa: F401 - module-scoped fixtures
    MODEL_ID,
    ServerThread,
    collect_stream,
    examples,
    model,
    openai_tools,
    user,
)

import needlepoint
from needlepoint.server import create_app
from needlepoint.server.metrics import LiveCollector

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: ServerThread) -> Samples:
    resp = httpx.get(f"{server.url}/metrics", timeout=30)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


@pytest.fixture()
def fresh(model: Any) -> Iterator[ServerThread]:  # noqa: F811
    with ServerThread(create_app(model, workers=2, model_name=MODEL_ID)) as server:
        yield server


def test_counts_match_the_responses(fresh: ServerThread,
                                    examples: list[dict[str, Any]]) -> None:  # noqa: F811
    client = fresh.client()
    prompt = completion = 0
    plain = examples[:3]
    for example in plain:
        out = client.chat.completions.create(model=MODEL_ID, messages=user(example["query"]),
                                             tools=openai_tools(example["tools"]))
        prompt += out.usage.prompt_tokens
        completion += out.usage.completion_tokens
    for example in examples[3:5]:
        streamed = collect_stream(client.chat.completions.create(
            model=MODEL_ID, messages=user(example["query"]), tools=openai_tools(example["tools"]),
            stream=True, stream_options={"include_usage": True}))
        prompt += streamed["usage"].prompt_tokens
        completion += streamed["usage"].completion_tokens
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=user("hi"), temperature=7)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=user("hi"))
    before = scrape(fresh)
    envelope = httpx.post(f"{fresh.url}/v1/needlepoint/complete", timeout=60,
                          json={"text": examples[5]["query"], "tools": examples[5]["tools"]}).json()
    after = scrape(fresh)

    chat = "/v1/chat/completions"
    assert value(before, "needlepoint_http_requests_total", route=chat, method="POST",
                 status="200") == 5
    assert value(before, "needlepoint_http_requests_total", route=chat, method="POST",
                 status="400") == 1
    assert value(before, "needlepoint_http_requests_total", route=chat, method="POST",
                 status="404") == 1
    assert value(before, "needlepoint_http_request_duration_seconds_count", route=chat) == 7
    assert value(before, "needlepoint_prompt_tokens_total") == prompt
    assert value(before, "needlepoint_completion_tokens_total") == completion
    assert prompt > 0 and completion > 0
    # one first token per answered chat request, none for refused ones
    assert value(before, "needlepoint_time_to_first_token_seconds_count") == 5
    assert value(before, "needlepoint_time_to_first_token_seconds_sum") > 0
    assert total(before, "needlepoint_answers_total") == 5
    # the native request: its envelope's own counts, exactly
    timings = envelope["timings"]
    assert value(after, "needlepoint_prompt_tokens_total") == prompt + timings["prefill_tokens"]
    assert value(after, "needlepoint_completion_tokens_total") == \
        completion + timings["decode_tokens"]
    assert value(after, "needlepoint_decode_passes_total") - \
        value(before, "needlepoint_decode_passes_total") == timings["decode_passes"]
    for source in ("lookup", "grammar", "opening"):
        for kind in ("drafted", "accepted"):
            name = f"needlepoint_speculative_{kind}_tokens_total"
            grew = value(after, name, source=source) - value(before, name, source=source)
            assert grew == timings[f"{source}_{kind}"], (source, kind)
    assert sum(timings[f"{s}_accepted"] for s in ("lookup", "grammar", "opening")) > 0
    assert value(after, "needlepoint_http_requests_total", route="/v1/needlepoint/complete",
                 method="POST", status="200") == 1
    assert value(after, "needlepoint_http_requests_total", route="/metrics", method="GET",
                 status="200") == 1  # the first scrape, counted by the second
    # the scheduler's own counters, as /health reports them; nothing left in flight
    stats = fresh.health()["scheduler"]
    assert value(after, "needlepoint_engine_steps_total") == stats["steps"] > 0
    assert value(after, "needlepoint_engine_step_sessions_total") == stats["sessions_stepped"]
    assert value(after, "needlepoint_requests_in_flight") == 0
    assert value(after, "needlepoint_live_sessions") == 0
    assert value(after, "needlepoint_kv_bytes") == 0
    assert value(after, "needlepoint_kv_bytes_limit") == stats["max_kv_bytes"]


def test_two_apps_count_separately(model: Any) -> None:  # noqa: F811
    with ServerThread(create_app(model, workers=1, model_name=MODEL_ID)) as one, \
            ServerThread(create_app(model, workers=1, model_name=MODEL_ID)) as two:
        one.client().models.list()
        one.client().models.list()
        two.client().models.list()
        key = ("needlepoint_http_requests_total",
               frozenset({"route": "/v1/models", "method": "GET", "status": "200"}.items()))
        assert scrape(one)[key] == 2
        assert scrape(two)[key] == 1


def gated_factory(gate: threading.Event, entered: threading.Semaphore) -> Any:
    class Gated(needlepoint.Needle):
        """A real Needle whose generation waits for the test (holding its session)."""

        def stream_ids(self, ids: Any, query: str, **options: Any) -> Iterator[Any]:
            entered.release()
            assert gate.wait(60)
            yield from super().stream_ids(ids, query, **options)

    return Gated


def test_live_gauges_while_requests_run(model: Any,  # noqa: F811
                                        examples: list[dict[str, Any]]) -> None:  # noqa: F811
    """One request decoding (holding a scheduler session), one waiting for the only worker:
    live sessions, KV bytes, in flight and queue depth say so, and drop back after."""
    gate, entered = threading.Event(), threading.Semaphore(0)
    app = create_app(model, workers=1, model_name=MODEL_ID,
                     needle_factory=gated_factory(gate, entered))
    scheduler = app.state.engine.scheduler
    example = examples[0]
    with ServerThread(app) as server:
        client = server.client(timeout=60)
        results: list[Any] = []

        def request() -> None:
            results.append(client.chat.completions.create(
                model=MODEL_ID, messages=user(example["query"]),
                tools=openai_tools(example["tools"])))

        threads = [threading.Thread(target=request) for _ in range(2)]
        try:
            for thread in threads:
                thread.start()
            assert entered.acquire(timeout=60)  # the first is running, gated
            for _ in range(600):  # wait until the second has been admitted as well
                if server.health()["in_flight"] == 2:
                    break
                threading.Event().wait(0.05)
            live = scrape(server)
        finally:
            gate.set()
            for thread in threads:
                thread.join(60)
        assert value(live, "needlepoint_requests_in_flight") == 2
        assert value(live, "needlepoint_queue_depth") == 1
        assert value(live, "needlepoint_live_sessions") == 1
        assert value(live, "needlepoint_kv_bytes") == scheduler.session_kv_bytes > 0
        assert len(results) == 2
        done = scrape(server)
        assert value(done, "needlepoint_requests_in_flight") == 0
        assert value(done, "needlepoint_kv_bytes") == 0
        assert value(done, "needlepoint_time_to_first_token_seconds_count") == 2


class FailingNeedle(needlepoint.Needle):
    """A real Needle whose generation fails after its first delta (an engine bug)."""

    def stream_ids(self, ids: Any, query: str, **options: Any) -> Iterator[Any]:
        events = super().stream_ids(ids, query, **options)
        yield next(events)
        raise RuntimeError("engine failure")


def test_failed_answers_are_counted(model: Any,  # noqa: F811
                                    examples: list[dict[str, Any]]) -> None:  # noqa: F811
    """A 500, and a stream that fails after its 200 (in-band error): both counted."""
    example = examples[0]
    app = create_app(model, workers=1, model_name=MODEL_ID, needle_factory=FailingNeedle)
    with ServerThread(app) as server:
        client = server.client()
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=MODEL_ID, messages=user(example["query"]),
                                           tools=openai_tools(example["tools"]))
        with pytest.raises(openai.APIError):
            collect_stream(client.chat.completions.create(
                model=MODEL_ID, messages=user(example["query"]),
                tools=openai_tools(example["tools"]), stream=True))
        samples = scrape(server)
    assert value(samples, "needlepoint_answers_failed_total", endpoint="chat",
                 error="RuntimeError") == 2
    chat = "/v1/chat/completions"
    assert value(samples, "needlepoint_http_requests_total", route=chat, method="POST",
                 status="500") == 1
    assert value(samples, "needlepoint_http_requests_total", route=chat, method="POST",
                 status="200") == 1  # the stream had started
    assert total(samples, "needlepoint_answers_total") == 0


class _Pool:
    trimmer = None  # no heap trimming

    def stats(self) -> dict[str, int]:
        return {"workers": 3, "max_queue": 5, "in_flight": 7, "peak_in_flight": 7}


def test_without_batching_live_sessions_are_the_running_requests() -> None:
    families = {f.name: f.samples[0].value for f in LiveCollector(_Pool(), None).collect()}
    assert families["needlepoint_live_sessions"] == 3  # 3 workers busy
    assert families["needlepoint_queue_depth"] == 4  # 7 admitted, 4 of them waiting
    assert "needlepoint_kv_bytes" not in families  # no scheduler: not tracked


def test_request_ids(fresh: ServerThread, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="needlepoint.access"), \
            httpx.Client(base_url=fresh.url, timeout=60) as http:
        responses = [
            http.get("/health"),
            http.get("/v1/models"),
            http.get("/v1/nowhere"),  # 404
            http.post("/v1/chat/completions", json={"model": MODEL_ID}),  # 400
            http.post("/v1/chat/completions", content=b"x" * (2 << 20)),  # 413
            http.get("/metrics"),
            http.get("/"),
        ]
        with http.stream("POST", "/v1/chat/completions", json={
                "model": MODEL_ID, "messages": user("wake me up at 7"), "stream": True}) as s:
            body = s.read()
            responses.append(s)
        assert body.endswith(b"data: [DONE]\n\n")
        ids = [r.headers["x-request-id"] for r in responses]
        assert [r.status_code for r in responses] == [200, 200, 404, 400, 413, 200, 200, 200]
        assert len(set(ids)) == len(ids) and all(i.startswith("req_") for i in ids)
        mine = http.get("/health", headers={"X-Request-ID": "client-abc.123:4"})
        assert mine.headers["x-request-id"] == "client-abc.123:4"  # a sane id is kept
        for bad in ["x" * 129, "has space", "semi;colon", ""]:
            got = http.get("/health", headers={"X-Request-ID": bad}).headers["x-request-id"]
            assert got != bad and got.startswith("req_")
    lines = [r.getMessage() for r in caplog.records if r.name == "needlepoint.access"]
    for rid, resp in zip(ids, responses, strict=True):
        line = next(line for line in lines if line.endswith(f"request_id={rid}"))
        assert f'"{resp.request.method} {resp.request.url.path}" {resp.status_code} ' in line
    assert any(line.endswith("request_id=client-abc.123:4") for line in lines)
