"""One admission (`api/admission.py`): the server's queue limit, session cap and KV budget are
one object's, which the worker pool and the scheduler both consume, so a place taken on one
side is seen by the other, and what is refused past them is one status: 429
`server_overloaded` (503 `shutting_down` once the admission is closed)."""

from __future__ import annotations

import threading

import pytest
from conftest import toy_model_path
from fastapi.testclient import TestClient

import needlepoint
from needlepoint.api.admission import Admission, AdmissionClosed, AdmissionFull
from needlepoint.api.batched import session_bytes
from needlepoint.server import create_app
from needlepoint.server.errors import as_api_error

BODY = {"model": "toy", "messages": [{"role": "user", "content": "hello"}],
        "tool_choice": "none", "max_tokens": 2}


@pytest.fixture(scope="module")
def model():
    return needlepoint.load(toy_model_path())


def test_places_past_running_plus_queue_are_refused() -> None:
    admission = Admission(2, max_queue=1)
    tickets = [admission.admit() for _ in range(3)]
    with pytest.raises(AdmissionFull, match="3 requests are already running or queued"):
        admission.admit()
    tickets[0].release()
    tickets[0].release()  # idempotent: one place given back, not two
    admission.admit()
    with pytest.raises(AdmissionFull):
        admission.admit()
    assert admission.stats()["in_flight"] == 3 and admission.stats()["peak_in_flight"] == 3


def test_reservations_are_capped_by_sessions_and_kv_bytes() -> None:
    by_sessions = Admission(2, kv_bytes=10)
    kept = [by_sessions.reserve(), by_sessions.reserve()]
    with pytest.raises(AdmissionFull, match="2 of 2 sessions live"):
        by_sessions.reserve()
    by_sessions.unreserve(kept.pop())
    assert by_sessions.reserve() == 10
    by_kv = Admission(8, kv_bytes=10, max_kv_bytes=25)
    by_kv.reserve(), by_kv.reserve()
    with pytest.raises(AdmissionFull, match="20 of 25 KV bytes"):
        by_kv.reserve()
    assert by_kv.stats()["refused"] == 1
    with pytest.raises(AdmissionFull, match="over the cap"):
        Admission(1, kv_bytes=10, max_kv_bytes=9).reserve()


def test_closing_wakes_a_waiting_reservation() -> None:
    admission = Admission(1)
    admission.reserve()
    failures: list[BaseException] = []

    def wait() -> None:
        try:
            admission.reserve(wait=True)
        except BaseException as error:  # noqa: BLE001 - recorded for the assertion
            failures.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    admission.close()
    waiter.join(timeout=30)
    assert not waiter.is_alive() and isinstance(failures[0], AdmissionClosed)
    assert as_api_error(failures[0]).status == 503
    assert as_api_error(AdmissionFull("x")).status == 429


@pytest.mark.parametrize("batching", [True, False])
def test_the_request_after_the_last_place_gets_429(model, batching: bool) -> None:
    app = create_app(model, workers=1, max_queue=1, batching=batching, model_name="toy")
    pool, scheduler = app.state.pool, app.state.engine.scheduler
    if batching:  # one admission, the scheduler's: the pool consumes it
        assert pool.admission is scheduler.admission
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=BODY).status_code == 200
        held = [pool.admission.admit(), pool.admission.admit()]  # workers + max_queue
        assert client.get("/health").json()["in_flight"] == 2
        response = client.post("/v1/chat/completions", json=BODY)
        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert error["code"] == "server_overloaded" and response.headers["Retry-After"] == "1"
        assert "2 requests are already running or queued" in error["message"]
        for ticket in held:
            ticket.release()
        assert client.post("/v1/chat/completions", json=BODY).status_code == 200
        metrics = client.get("/metrics").text
    assert "needlepoint_requests_in_flight 0.0" in metrics


def test_a_session_reserved_elsewhere_is_a_429_for_the_server(model) -> None:
    """The scheduler's sessions and the KV budget are the same admission's: a reservation
    made outside the server (a `complete_many` on the same scheduler, say) leaves it none."""
    per = session_bytes(model.session())
    app = create_app(model, workers=2, max_queue=4, max_kv_bytes=per + per // 2,
                     model_name="toy")
    admission = app.state.engine.scheduler.admission
    with TestClient(app) as client:
        kv = admission.reserve()
        response = client.post("/v1/chat/completions", json=BODY)
        assert response.status_code == 429 and "KV bytes" in response.json()["error"]["message"]
        admission.unreserve(kv)
        assert client.post("/v1/chat/completions", json=BODY).status_code == 200
        assert client.get("/health").json()["scheduler"]["refused"] == 1
