"""The server on the continuous-batching scheduler (the default): concurrent requests are
decoded together and get the answers they get alone; the KV-bytes cap gives 429; a client
that goes away (a closed stream, a plain request whose connection drops) frees its session;
`batching=False` keeps the per-worker sessions; the command line's batching flags.
"""

# The shared module-scoped fixtures (examples, model) are imported from server_helpers and
# requested by name as test parameters, which pyflakes reads as shadowing.
# ruff: noqa: F811

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from server_helpers import (  # noqa: F401 (fixtures, requested by name)
    MODEL_ID,
    ServerThread,
    ask,
    calls_of,
    check_error,
    collect_stream,
    examples,
    free_text,
    library_calls,
    model,
    user,
)

import needlepoint
from needlepoint.api.batched import session_bytes
from needlepoint.server import cli, create_app


def wait_until(condition: Callable[[], bool], limit: float = 60.0) -> None:
    """Poll (a guard against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_concurrent_requests_are_batched_and_answer_as_alone(
        model: Any, examples: list[dict[str, Any]]) -> None:
    examples = examples[:16]
    expected = [library_calls(needlepoint.Needle(tools=e["tools"], model=model)
                              .complete(e["query"])) for e in examples]
    app = create_app(model, workers=16, model_name=MODEL_ID)
    with ServerThread(app) as server:
        client = server.client()

        def one(i: int) -> list[tuple[str, dict[str, Any]]]:
            if i % 4 == 3:
                return collect_stream(ask(client, examples[i], stream=True))["calls"]
            return calls_of(ask(client, examples[i]).choices[0].message)

        with ThreadPoolExecutor(len(examples)) as pool:
            together = list(pool.map(one, range(len(examples))))
        health = server.health()
    assert together == expected
    assert health["batching"] is True and health["workers"] == 16
    stats = health["scheduler"]
    assert stats["max_sessions"] == 16 and stats["batched"] is True
    assert stats["max_batch"] >= 2  # several requests shared an engine step
    assert stats["leases"] == len(examples) and stats["live_sessions"] == 0
    assert health["in_flight"] == 0


def test_kv_cap_gives_429_and_frees_with_the_request(model: Any) -> None:
    per = session_bytes(model.session())
    app = create_app(model, workers=4, max_kv_bytes=per + per // 2, model_name=MODEL_ID)
    with ServerThread(app) as server:
        client = server.client()
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=user("hello"), tool_choice="none", max_tokens=400,
            stream=True)
        next(iter(stream))  # decoding now: its session is live
        with pytest.raises(openai.RateLimitError) as err:
            free_text(client, "hello", max_tokens=3)
        check_error(err.value, 429, code="server_overloaded")
        assert "KV bytes" in err.value.body["message"]
        stream.close()
        wait_until(lambda: server.health()["scheduler"]["live_sessions"] == 0)
        assert free_text(client, "hello", max_tokens=3).choices[0].finish_reason == "length"
        stats = server.health()["scheduler"]
        assert stats["refused"] == 1 and stats["cancelled"] == 1
        wait_until(lambda: server.health()["in_flight"] == 0)


def test_dropped_connection_frees_a_plain_request(model: Any) -> None:
    # one pass per token (no speculation), so the 450-token turn outlasts the client's timeout
    # (the native step decodes the toy model at ~2000 tok/s: 0.3 s was no longer enough)
    app = create_app(model, workers=2, model_name=MODEL_ID, speculate=False)
    with ServerThread(app) as server:
        body = {"model": MODEL_ID, "messages": user("hello"), "tool_choice": "none",
                "max_tokens": 450}
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
            httpx.post(f"{server.url}/v1/chat/completions", json=body,
                       timeout=httpx.Timeout(5.0, read=0.05))
        wait_until(lambda: server.health()["in_flight"] == 0)
        stats = server.health()["scheduler"]
        assert stats["cancelled"] == 1 and stats["live_sessions"] == 0
        # the turn (~450 steps) was cut short: far fewer rows than it would have run
        assert stats["rows"] < 300
        client = server.client()
        assert free_text(client, "hello", max_tokens=2).choices[0].finish_reason == "length"


def test_closed_stream_cancels_its_session(model: Any) -> None:
    app = create_app(model, workers=2, model_name=MODEL_ID)
    with ServerThread(app) as server:
        client = server.client()
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=user("hello"), tool_choice="none", max_tokens=450,
            stream=True)
        for n, _ in enumerate(stream):
            if n == 3:
                break
        stream.close()
        wait_until(lambda: server.health()["in_flight"] == 0)
        stats = server.health()["scheduler"]
        assert stats["cancelled"] == 1 and stats["live_sessions"] == 0
        # a finished stream is not counted as cancelled
        collect_stream(free_text(client, "hello", max_tokens=5, stream=True))
        assert server.health()["scheduler"]["cancelled"] == 1


def test_without_batching_each_worker_runs_its_own(model: Any,
                                                   examples: list[dict[str, Any]]) -> None:
    app = create_app(model, workers=1, batching=False, model_name=MODEL_ID)
    assert app.state.engine.scheduler is None
    with ServerThread(app) as server:
        expected = needlepoint.Needle(tools=examples[0]["tools"], model=model).complete(
            examples[0]["query"])
        out = ask(server.client(), examples[0])
        assert calls_of(out.choices[0].message) == library_calls(expected)
        health = server.health()
        assert health["batching"] is False and "scheduler" not in health


def test_cli_batching_flags() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([])
    assert args.batching is True and args.step_tokens is None and args.max_kv_bytes == 1 << 30
    args = parser.parse_args(["--no-batching", "--max-kv-bytes", "1000", "--step-tokens", "64",
                              "--workers", "8"])
    assert (args.batching, args.max_kv_bytes, args.step_tokens, args.workers) == (
        False, 1000, 64, 8)
    with pytest.raises(SystemExit):
        parser.parse_args(["--step-tokens", "0"])
