"""The OpenAI-compatible server end to end, on the bundled toy model.

uvicorn runs in a background thread on a free loopback port and is stopped with
`should_exit`; requests go through the official `openai` client (raw httpx only for bodies
the client cannot produce: malformed JSON, an oversized body). Expected answers come from
the library itself (`needlepoint.Needle`), so the server is checked to add nothing and lose
nothing. Greedy decoding throughout unless a test is about sampling.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from conftest import toy_model_path

import needlepoint
from needlepoint.server import create_app
from needlepoint.server.streaming import ARGS, START, CallSplitter, merge_args

MODEL_ID = "needle3-toy"
MAX_BODY = 256 * 1024


class ServerThread:
    """uvicorn on 127.0.0.1 with an OS-chosen port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "server did not shut down"

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def client(self, **kwargs: Any) -> openai.OpenAI:
        # No retries: a 429 or 5xx must surface, not be papered over.
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="-", max_retries=0, **kwargs)

    def health(self) -> dict[str, Any]:
        root = openai.OpenAI(base_url=self.url, api_key="-", max_retries=0)
        return root.get("/health", cast_to=object)


@pytest.fixture(scope="module")
def model() -> Any:
    return needlepoint.load(toy_model_path())


@pytest.fixture(scope="module")
def server(model: Any) -> Iterator[ServerThread]:
    app = create_app(model, workers=2, max_queue=64, max_body_bytes=MAX_BODY,
                     model_name=MODEL_ID)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def examples() -> list[dict[str, Any]]:
    path = toy_model_path().with_name("needle3-toy.eval.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()[:24]]


def openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": tool} for tool in tools]


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def calls_of(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def library_calls(envelope: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["name"], c["arguments"]) for c in envelope["function_calls"]]


def ask(client: openai.OpenAI, example: dict[str, Any], **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL_ID, messages=user(example["query"]), tools=openai_tools(example["tools"]),
        **kwargs,
    )


def collect_stream(stream: Any) -> dict[str, Any]:
    """Accumulate streamed chunks the way OpenAI's clients do."""
    calls: dict[int, dict[str, str]] = {}
    out: dict[str, Any] = {"content": "", "chunks": 0, "finish": None, "usage": None}
    for chunk in stream:
        out["chunks"] += 1
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            out["content"] += delta.content or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += tc.id or ""
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    out["calls"] = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
    out["ids"] = [c["id"] for _, c in sorted(calls.items())]
    return out


# ---------------------------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------------------------
def test_models_and_health(server: ServerThread, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    health = server.health()
    assert health["status"] == "ok" and health["model"] == MODEL_ID and health["workers"] == 2


def test_model_id_defaults_to_file_stem() -> None:
    app = create_app(toy_model_path(), workers=1)
    assert app.state.engine.name == "needle3-toy"
    assert app.state.engine.context_length == 512


def test_chat_tool_calls_match_library(client: openai.OpenAI, model: Any,
                                       examples: list[dict[str, Any]]) -> None:
    for example in examples[:4]:
        needle = needlepoint.Needle(tools=example["tools"], model=model)
        expected = needle.complete(example["query"])
        out = ask(client, example)
        choice = out.choices[0]
        assert calls_of(choice.message) == library_calls(expected)
        assert choice.finish_reason == ("tool_calls" if expected["function_calls"] else "stop")
        for call in choice.message.tool_calls or []:
            assert isinstance(call.function.arguments, str) and call.id.startswith("call_")
        assert out.model == MODEL_ID
        assert out.usage.prompt_tokens == len(needle.prompt_ids(example["query"]))
        assert out.usage.completion_tokens == expected["timings"]["decode_tokens"]
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_stream_equals_non_stream(client: openai.OpenAI, examples: list[dict[str, Any]]) -> None:
    for example in examples[:3]:
        whole = ask(client, example)
        streamed = collect_stream(
            ask(client, example, stream=True, stream_options={"include_usage": True})
        )
        assert streamed["calls"] == calls_of(whole.choices[0].message)
        assert streamed["finish"] == whole.choices[0].finish_reason
        assert streamed["usage"].completion_tokens == whole.usage.completion_tokens
        assert all(call_id.startswith("call_") for call_id in streamed["ids"])
        if streamed["calls"]:  # arguments arrive in pieces, as tokens are decoded
            assert streamed["chunks"] > 4


def test_stream_is_incremental(client: openai.OpenAI, examples: list[dict[str, Any]]) -> None:
    """The first content arrives long before the last: streaming is not faked."""
    start = time.perf_counter()
    arrivals = []
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=user(examples[0]["query"]), tool_choice="none",
        max_tokens=150, stream=True,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - start)
    total = time.perf_counter() - start
    assert len(arrivals) > 20
    assert arrivals[0] < 0.5 * total


def test_system_message_reaches_the_prompt(client: openai.OpenAI, model: Any,
                                           examples: list[dict[str, Any]]) -> None:
    example = examples[0]
    system = "locale: en-GB"
    messages = [{"role": "system", "content": system}, *user(example["query"])]
    out = client.chat.completions.create(model=MODEL_ID, messages=messages,
                                         tools=openai_tools(example["tools"]))
    needle = needlepoint.Needle(tools=example["tools"], model=model, system=system)
    assert out.usage.prompt_tokens == len(needle.prompt_ids(example["query"]))
    assert calls_of(out.choices[0].message) == library_calls(needle.complete(example["query"]))


def test_native_envelope(server: ServerThread, model: Any,
                         examples: list[dict[str, Any]]) -> None:
    example = examples[0]
    root = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    body = {"text": example["query"], "tools": openai_tools(example["tools"]), "model": MODEL_ID}
    envelope = root.post("/needlepoint/complete", body=body, cast_to=object)
    expected = needlepoint.Needle(tools=example["tools"], model=model).complete(example["query"])
    assert envelope["type"] == expected["type"]
    assert envelope["function_calls"] == expected["function_calls"]
    assert {"reasoning", "confidence", "timings"} <= envelope.keys()
    assert envelope["timings"]["decode_tokens"] == expected["timings"]["decode_tokens"]
    with pytest.raises(openai.BadRequestError):
        root.post("/needlepoint/complete", body={**body, "max_new_tokens": -1}, cast_to=object)


# ---------------------------------------------------------------------------------------------
# Generation options, tool_choice, multi-turn
# ---------------------------------------------------------------------------------------------
def free_text(client: openai.OpenAI, query: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL_ID, messages=user(query), tool_choice="none", **kwargs
    )


def test_sampling_options_are_honoured(client: openai.OpenAI) -> None:
    query = "hello"
    greedy = free_text(client, query, max_tokens=40).choices[0].message.content
    hot = dict(temperature=1.5, max_tokens=40)
    a = free_text(client, query, seed=11, **hot).choices[0].message.content
    b = free_text(client, query, seed=11, **hot).choices[0].message.content
    c = free_text(client, query, seed=12, **hot).choices[0].message.content
    assert a == b  # seed honoured
    assert a != greedy and a != c  # temperature honoured, seed changes the draw
    # a vanishing nucleus keeps only the top token: sampling degenerates to greedy
    tiny = free_text(client, query, seed=11, top_p=1e-9, **hot).choices[0].message.content
    assert tiny == greedy
    short = free_text(client, "hello", max_tokens=5)
    assert short.choices[0].finish_reason == "length"
    assert short.usage.completion_tokens == 5


def test_tool_choice(client: openai.OpenAI, examples: list[dict[str, Any]]) -> None:
    refusal = next(e for e in examples if e["answers"] == [] and len(e["tools"]) >= 2)
    out = ask(client, refusal, tool_choice="none")
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].finish_reason in ("stop", "length")
    forced = ask(client, refusal, tool_choice="required")
    assert forced.choices[0].finish_reason == "tool_calls"
    name = refusal["tools"][-1]["name"]
    named = ask(client, refusal, tool_choice={"type": "function", "function": {"name": name}})
    assert [n for n, _ in calls_of(named.choices[0].message)] == [name]
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, refusal, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"] == "tool_choice"


def test_multi_turn_matches_library(client: openai.OpenAI, model: Any,
                                    examples: list[dict[str, Any]]) -> None:
    """Replaying the model's own first answer plus a tool result gives the same next turn
    as the library's stateful `send_tool_results`."""
    example = next(e for e in examples if len(e["answers"]) == 1)
    needle = needlepoint.Needle(tools=example["tools"], model=model)
    first = needle.complete(example["query"])
    results = [{"name": c["name"], "result": {"ok": True}} for c in first["function_calls"]]
    second = needle.send_tool_results(results)
    messages = [
        {"role": "system", "content": ""},
        *user(example["query"]),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for i, c in enumerate(first["function_calls"])]},
        *[{"role": "tool", "tool_call_id": f"c{i}", "content": '{"ok": true}'}
          for i in range(len(first["function_calls"]))],
    ]
    out = client.chat.completions.create(
        model=MODEL_ID, messages=messages, tools=openai_tools(example["tools"])
    )
    assert calls_of(out.choices[0].message) == library_calls(second)
    assert out.usage.prompt_tokens > len(needle.prompt_ids(example["query"]))


# ---------------------------------------------------------------------------------------------
# Concurrency
# ---------------------------------------------------------------------------------------------
def test_concurrent_requests_do_not_cross_talk(client: openai.OpenAI,
                                               examples: list[dict[str, Any]]) -> None:
    examples = examples[:12]
    alone = [calls_of(ask(client, e).choices[0].message) for e in examples]

    def one(i: int) -> list[tuple[str, dict[str, Any]]]:
        if i % 2:
            return collect_stream(ask(client, examples[i], stream=True))["calls"]
        return calls_of(ask(client, examples[i]).choices[0].message)

    order = list(range(len(examples))) * 2
    with ThreadPoolExecutor(len(order)) as pool:
        together = list(pool.map(one, order))
    assert together == [alone[i] for i in order]
    assert len({json.dumps(a) for a in alone}) > 5  # the requests really differ


def test_queue_full_gives_429(model: Any, examples: list[dict[str, Any]]) -> None:
    app = create_app(model, workers=1, max_queue=1)
    with ServerThread(app) as server:
        client = server.client()
        barrier = threading.Barrier(6)

        def one(_: int) -> str:
            barrier.wait()
            try:
                client.chat.completions.create(
                    model="needle3-toy", messages=user("hello"), tool_choice="none",
                    max_tokens=120,
                )
                return "ok"
            except openai.RateLimitError as err:
                assert err.body["type"] == "rate_limit_error"
                return "429"

        with ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(one, range(6)))
        assert outcomes.count("ok") >= 2 and outcomes.count("429") >= 1
        assert server.health()["in_flight"] == 0
        assert client.chat.completions.create(  # still serving
            model="needle3-toy", messages=user("hello"), tool_choice="none", max_tokens=3
        ).choices[0].finish_reason == "length"


def test_disconnected_stream_frees_its_worker(server: ServerThread,
                                              client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=user("hello"), tool_choice="none", max_tokens=400,
        stream=True,
    )
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    deadline = time.monotonic() + 0.5  # the whole turn (~260 tokens) takes about a second
    while server.health()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.health()["in_flight"] == 0


# ---------------------------------------------------------------------------------------------
# Bad input: 4xx with an OpenAI-style error object, and the server keeps serving
# ---------------------------------------------------------------------------------------------
def check_error(err: Any, status: int, param: str | None = None, code: str | None = None) -> None:
    assert err.status_code == status
    body = err.body
    assert isinstance(body, dict) and body["message"] and body["type"]
    assert {"message", "type", "param", "code"} <= body.keys()
    if param is not None:
        assert body["param"] == param
    if code is not None:
        assert body["code"] == code


WEATHER = {"name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize(
    ("kwargs", "status", "param", "code"),
    [
        ({"model": "gpt-4o"}, 404, "model", "model_not_found"),
        ({"tools": [{"type": "function", "function": {**WEATHER, "name": "bad name!"}}]},
         400, "tools", "invalid_tool"),
        ({"tools": [{"type": "function",
                     "function": {**WEATHER, "parameters": {"type": "string"}}}]},
         400, "tools", "invalid_tool"),
        ({"max_tokens": -1}, 400, "max_tokens", None),
        ({"max_tokens": 0}, 400, "max_tokens", None),
        ({"max_tokens": 10**12}, 400, "max_tokens", None),
        ({"max_tokens": 100_000}, 400, "max_tokens", "invalid_max_tokens"),
        ({"max_tokens": 500}, 400, "max_tokens", "context_length_exceeded"),
        ({"temperature": 7}, 400, "temperature", None),
        ({"top_p": 0}, 400, "top_p", None),
        ({"n": 3}, 400, "n", None),
        ({"stop": ["\n"]}, 400, None, None),  # would be ignored: refused instead
        ({"presence_penalty": 0.5}, 400, None, None),
        ({"messages": []}, 400, "messages", None),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, 400, "messages.0", None),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, None, None),
        ({"messages": [*user("hi"), {"role": "tool", "tool_call_id": "x", "content": "1"}]},
         400, None, None),
        ({"messages": user("book a table " * 300)}, 400, "messages", "context_length_exceeded"),
        ({"tool_choice": "required", "tools": []}, 400, "tool_choice", None),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_requests(client: openai.OpenAI, kwargs: dict[str, Any], status: int,
                      param: str | None, code: str | None, stream: bool) -> None:
    request = {"model": MODEL_ID, "messages": user("weather in Oslo"),
               "tools": [{"type": "function", "function": WEATHER}], **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**request, stream=stream)
    check_error(err.value, status, param, code)
    if status == 404:
        assert isinstance(err.value, openai.NotFoundError)


def test_raw_bad_bodies(server: ServerThread, client: openai.OpenAI) -> None:
    url = f"{server.url}/v1/chat/completions"
    with httpx.Client(timeout=30) as http:
        bad_json = http.post(url, content=b'{"model": "needle3-toy", "messages": [',
                             headers={"content-type": "application/json"})
        assert bad_json.status_code == 400
        assert bad_json.json()["error"]["code"] == "invalid_json"
        not_object = http.post(url, json=[1, 2, 3])
        assert not_object.status_code == 400 and "error" in not_object.json()
        big = {"model": MODEL_ID, "messages": user("x" * (MAX_BODY + 10))}
        too_big = http.post(url, json=big)
        assert too_big.status_code == 413
        assert too_big.json()["error"]["code"] == "request_too_large"
        chunked = http.post(url, content=iter([b"{" + b" " * MAX_BODY, b"}"]),
                            headers={"content-type": "application/json"})
        assert chunked.status_code == 413
        missing = http.get(f"{server.url}/v1/nowhere")
        assert missing.status_code == 404 and "error" in missing.json()
    with pytest.raises(openai.APIStatusError) as err:  # the official client, same limit
        client.chat.completions.create(model=MODEL_ID, messages=user("y" * (MAX_BODY + 1)))
    check_error(err.value, 413)
    # still serving after all of the above
    assert server.health()["in_flight"] == 0
    out = free_text(client, "hello", max_tokens=2)
    assert out.choices[0].finish_reason == "length"


# ---------------------------------------------------------------------------------------------
# Pieces: the incremental call splitter, the command line
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_call_splitter(step: int) -> None:
    calls = [
        {"name": "f", "arguments": {"a": 1, "b": 'x}\\"y', "c": [1, {"d": None}]}},
        {"arguments": {"z": True}, "name": "g"},  # arguments before the name
        {"name": "h"},  # no arguments at all
    ]
    text = json.dumps(calls, separators=(",", ":"))
    splitter = CallSplitter()
    events = []
    for i in range(0, len(text), step):
        events += splitter.feed(text[i : i + step])
    events = merge_args(events)
    starts = [(i, name) for kind, i, name in events if kind == START]
    assert starts == [(0, "f"), (1, "g"), (2, "h")]
    args = {i: "" for i, _ in starts}
    for kind, i, piece in events:
        if kind == ARGS:
            args[i] += piece
    assert json.loads(args[0]) == calls[0]["arguments"]
    assert json.loads(args[1]) == calls[1]["arguments"]
    assert args[2] == ""


def test_cli_serve_subprocess() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "needlepoint.cli", "serve", "--model", str(toy_model_path()),
         "--port", str(port), "--workers", "1", "--log-level", "warning"],
        env=env,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-",
                               max_retries=0)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "server exited"
            try:
                assert [m.id for m in client.models.list().data] == [MODEL_ID]
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        out = free_text(client, "hello", max_tokens=3)
        assert out.choices[0].finish_reason == "length"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class ExplodingNeedle(needlepoint.Needle):
    """A real Needle whose generation fails after its first delta (an engine bug)."""

    def stream(self, text: str, **options: Any) -> Iterator[Any]:
        events = super().stream(text, **options)
        yield next(events)
        raise RuntimeError("engine failure")


def test_engine_failure_is_reported_not_dropped(model: Any,
                                                examples: list[dict[str, Any]]) -> None:
    """Not a client error, so a 500, but still an error object (in-band once streaming)."""
    app = create_app(model, workers=1, model_name=MODEL_ID, needle_factory=ExplodingNeedle)
    with ServerThread(app) as server:
        client = server.client()
        with pytest.raises(openai.InternalServerError) as err:
            ask(client, examples[0])
        check_error(err.value, 500, code="internal_error")
        with pytest.raises(openai.APIError, match="Internal server error"):
            collect_stream(ask(client, examples[0], stream=True))
        assert server.health()["in_flight"] == 0
