"""Confidence hand-off (issue 29 item 3): `Needle(handoff=Handoff(...))` and
`create_app(handoff=...)` (`serve --handoff-url ...`), with a second `needlepoint serve` on
loopback (a subprocess of the real command) as the "bigger model". The toy model answers on
both ends, so a handed-off answer is the second server's answer to the same conversation."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest
from mcp_helpers import free_port, stop_process
from server_helpers import MODEL_ID, ServerThread, model  # noqa: F401

from needlepoint.api.handoff import Handoff
from needlepoint.api.needle import Needle
from needlepoint.errors import InvalidOptionError
from needlepoint.server import create_app

QUERY = "wake me up at 06:45"
TOOL = {"name": "set_alarm", "description": "Set an alarm at a time of day.",
        "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                       "required": ["time"]}}
SRC = Path(__file__).resolve().parents[2] / "src"
KEY = "big-secret-key-29"


@pytest.fixture(scope="module")
def big():
    """`needlepoint serve` on 127.0.0.1 (the bundled demo model), requiring an API key."""
    process, url = start_serve("--api-key", KEY)
    try:
        yield f"{url}/v1"
    finally:
        stop(process)


def start_serve(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`needlepoint serve ARGS` on a free loopback port, once /health answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", **(env or {})}
    log = tempfile.TemporaryFile()  # a file, not a pipe: it never fills up
    process = subprocess.Popen([sys.executable, "-m", "needlepoint", "serve", "--port",
                                str(port), "--workers", "2", "--log-level", "warning", *args],
                               env=env, stdout=subprocess.DEVNULL, stderr=log)
    process.log = log  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise AssertionError(f"serve exited: {log_of(process)[-2000:]}")
        assert time.monotonic() < deadline, "serve did not start"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)


def log_of(process: subprocess.Popen) -> str:
    process.log.seek(0)  # type: ignore[attr-defined]
    return process.log.read().decode("utf-8", "replace")  # type: ignore[attr-defined]


def stop(process: subprocess.Popen) -> None:
    stop_process(process, 20, 20)


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("BIG_KEY_29", KEY)
    return "BIG_KEY_29"


def big_answer(big: str) -> list[dict]:
    client = openai.OpenAI(base_url=big, api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model=MODEL_ID, messages=[
        {"role": "user", "content": QUERY}], tools=[{"type": "function", "function": TOOL}])
    import json

    return [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
            for c in reply.choices[0].message.tool_calls or []]


def test_every_answer_has_a_confidence(model):  # noqa: F811
    envelope = Needle(tools=[TOOL], model=model).complete(QUERY)
    assert envelope["confidence_source"] == "tokens"  # the toy archive has no head ...
    assert 0.0 < envelope["confidence"] <= 1.0  # ... the token measure is the confidence


def test_an_unsure_answer_goes_to_the_bigger_model(model, big, key_env):  # noqa: F811
    needle = Needle(tools=[TOOL], model=model,
                    handoff=Handoff(big, MODEL_ID, api_key_env=key_env, below=1.0))
    local = Needle(tools=[TOOL], model=model).complete(QUERY)
    envelope = needle.complete(QUERY)
    assert envelope["handoff"] == {"reason": "low_confidence", "model": MODEL_ID,
                                   "confidence": local["confidence"], "answered": True}
    assert envelope["function_calls"] == big_answer(big)
    assert envelope["timings"]["handoff_s"] > 0


def test_a_sure_answer_stays_local(model, big, key_env):  # noqa: F811
    needle = Needle(tools=[TOOL], model=model,
                    handoff=Handoff(big, MODEL_ID, api_key_env=key_env, below=0.0))
    assert "handoff" not in needle.complete(QUERY)


def test_a_cut_answer_is_handed_off(model, big, key_env):  # noqa: F811
    needle = Needle(tools=[TOOL], model=model,
                    handoff=Handoff(big, MODEL_ID, api_key_env=key_env, below=0.0))
    envelope = needle.complete(QUERY, max_new_tokens=2)
    assert envelope["handoff"]["reason"] == "cut" and envelope["handoff"]["answered"]


def test_a_failing_endpoint_keeps_the_local_answer(model, big):  # noqa: F811
    local = Needle(tools=[TOOL], model=model).complete(QUERY)
    no_key = Needle(tools=[TOOL], model=model, handoff=Handoff(big, MODEL_ID, below=1.0))
    envelope = no_key.complete(QUERY)
    assert envelope["function_calls"] == local["function_calls"]
    assert envelope["handoff"]["answered"] is False and "HTTP 401" in envelope["handoff"]["error"]
    down = Handoff(f"http://127.0.0.1:{free_port()}/v1", MODEL_ID, below=1.0)
    envelope = Needle(tools=[TOOL], model=model, handoff=down).complete(QUERY)
    assert envelope["handoff"]["answered"] is False
    assert envelope["function_calls"] == local["function_calls"]


def test_a_silent_endpoint_times_out(model):  # noqa: F811
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        handoff = Handoff(f"http://127.0.0.1:{port}/v1", MODEL_ID, below=1.0, timeout=1.0)
        start = time.monotonic()
        envelope = Needle(tools=[TOOL], model=model, handoff=handoff).complete(QUERY)
    assert envelope["type"] == "call" and envelope["handoff"]["answered"] is False
    assert "did not answer" in envelope["handoff"]["error"]
    assert time.monotonic() - start < 30


def test_the_key_never_shows_in_an_error(model, big, monkeypatch):  # noqa: F811
    monkeypatch.setenv("WRONG_KEY_29", "wrong-key-value-29")
    needle = Needle(tools=[TOOL], model=model,
                    handoff=Handoff(big, MODEL_ID, api_key_env="WRONG_KEY_29", below=1.0))
    envelope = needle.complete(QUERY)
    assert "wrong-key-value-29" not in str(envelope)


def test_bad_handoff_options_are_typed_errors():
    with pytest.raises(InvalidOptionError, match="below"):
        Handoff("http://127.0.0.1:1/v1", "m", below=2)
    with pytest.raises(InvalidOptionError, match="base_url"):
        Handoff("127.0.0.1:1", "m")


def test_the_server_hands_off_with_a_header_and_a_metric(model, big, key_env):  # noqa: F811
    app = create_app(model, workers=2, model_name=MODEL_ID,
                     handoff=Handoff(big, MODEL_ID, api_key_env=key_env, below=1.0))
    with ServerThread(app) as server:
        client = server.client()
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=[{"role": "user", "content": QUERY}],
            tools=[{"type": "function", "function": TOOL}])
        assert raw.headers["x-needlepoint-handoff"] == \
            f"low_confidence; model={MODEL_ID}; answered=true"
        import json

        calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                 for c in raw.parse().choices[0].message.tool_calls]
        assert calls == big_answer(big)
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": QUERY}], stream=True,
            tools=[{"type": "function", "function": TOOL}])
        assert any(chunk.choices and chunk.choices[0].delta.tool_calls for chunk in stream)
        response = client.responses.create(model=MODEL_ID, input=QUERY, tools=[
            {"type": "function", **TOOL}])
        assert response.model_extra["needlepoint"]["handoff"]["reason"] == "low_confidence"
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'needlepoint_handoffs_total{outcome="answered",reason="low_confidence"} 3.0' \
            in metrics
        assert KEY not in metrics


def test_a_failing_endpoint_is_never_a_500(model):  # noqa: F811
    down = Handoff(f"http://127.0.0.1:{free_port()}/v1", MODEL_ID, below=1.0)
    with ServerThread(create_app(model, workers=2, model_name=MODEL_ID, handoff=down)) as server:
        raw = server.client().chat.completions.with_raw_response.create(
            model=MODEL_ID, messages=[{"role": "user", "content": QUERY}],
            tools=[{"type": "function", "function": TOOL}])
        assert raw.status_code == 200
        assert raw.headers["x-needlepoint-handoff"].endswith("answered=false")
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'needlepoint_handoffs_total{outcome="failed",reason="low_confidence"} 1.0' \
            in metrics




def test_serve_flags_wire_mcp_and_handoff(big):
    """`needlepoint serve --mcp examples/mcp.json --handoff-url ... --handoff-key-env ...`."""
    mcp = Path(__file__).resolve().parents[2] / "examples" / "mcp.json"
    process, url = start_serve("--mcp", str(mcp), "--handoff-url", big, "--handoff-model",
                               MODEL_ID, "--handoff-below", "1.0", "--handoff-key-env",
                               "BIG_KEY_29", env={"BIG_KEY_29": KEY})
    try:
        listed = httpx.get(f"{url}/v1/needlepoint/mcp/tools").json()["data"]
        assert [(t["name"], t["server"]) for t in listed] == [("set_alarm", "alarms"),
                                                              ("get_weather", "alarms")]
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": MODEL_ID, "messages": [{"role": "user", "content": QUERY}],
            "tools": [{"type": "function", "function": TOOL}]})
        assert reply.headers["x-needlepoint-handoff"].endswith("answered=true")
    finally:
        stop(process)
    assert KEY not in log_of(process)


def test_serve_refuses_a_handoff_url_without_a_model():
    result = subprocess.run([sys.executable, "-m", "needlepoint", "serve", "--handoff-url",
                             "http://127.0.0.1:1/v1"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120)
    assert result.returncode != 0 and "--handoff-model" in result.stderr
