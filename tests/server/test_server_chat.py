"""The OpenAI-compatible server end to end, on the bundled toy model: endpoints, chat
completions (plain and streamed) against the library's own answers, generation options,
tool_choice, multi-turn, and concurrency. Setup and helpers: `server_helpers.py`.
"""

# The shared module-scoped fixtures (client, examples, model, server) are imported from
# server_helpers and requested by name as test parameters, which pyflakes reads as shadowing.
# ruff: noqa: F811

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from conftest import toy_model_path
from server_helpers import (  # noqa: F401 (fixtures, requested by name)
    MODEL_ID,
    ServerThread,
    ask,
    calls_of,
    client,
    collect_stream,
    examples,
    free_text,
    library_calls,
    model,
    openai_tools,
    server,
    user,
)

import needlepoint
from needlepoint.generation.events import TextDelta
from needlepoint.server import create_app


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


def wire_prompt_tokens(model: Any, tools: list[dict[str, Any]], query: str) -> int:
    """The first prompt's length as the fixture README's wire format defines it, counted with
    the tokenizer alone: `[BOS] + encode(<|im_start|>user\n<tools>JSON</tools>\nquery
    <|im_end|>\n<|im_start|>assistant\n)` (no system turn)."""
    tools_json = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    text = (f"<|im_start|>user\n<tools>{tools_json}</tools>\n{query}<|im_end|>\n"
            "<|im_start|>assistant\n")
    return 1 + len(model.tokenizer.encode(text))


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
        assert out.usage.prompt_tokens == wire_prompt_tokens(model, example["tools"],
                                                             example["query"])
        assert out.usage.completion_tokens == expected["timings"]["decode_tokens"]
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_the_prompt_is_tokenized_once(model: Any, examples: list[dict[str, Any]]) -> None:
    """The server checks the context with, reports and decodes the same prompt ids: one
    tokenization per request (`Needle.chat_ids` once, then `stream_ids`)."""
    queries = []

    class Counting(needlepoint.Needle):
        def chat_ids(self, chat: Any) -> list[int]:
            queries.append(chat.query)
            return super().chat_ids(chat)

    app = create_app(model, workers=1, model_name=MODEL_ID, needle_factory=Counting)
    with ServerThread(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0,
                               timeout=120)
        out = ask(client, examples[0])
    assert queries == [examples[0]["query"]]
    assert out.usage.prompt_tokens == wire_prompt_tokens(model, examples[0]["tools"],
                                                         examples[0]["query"])


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


def test_stream_is_incremental(model: Any, examples: list[dict[str, Any]]) -> None:
    """The first content reaches the client while the turn is still being decoded, not after:
    the model's generator is held after its first text delta until the client has read it (a
    server that buffered the answer would never let it go on)."""
    read = threading.Event()

    class Held(needlepoint.Needle):
        def stream_ids(self, ids: Any, query: str, **options: Any) -> Iterator[Any]:
            events = super().stream_ids(ids, query, **options)
            for event in events:
                yield event
                if isinstance(event, TextDelta) and event.text:
                    break
            if not read.wait(30):
                raise RuntimeError("the client got nothing while the turn was held")
            yield from events

    app = create_app(model, workers=1, model_name=MODEL_ID, needle_factory=Held)
    with ServerThread(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0,
                               timeout=120)
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=user(examples[0]["query"]), tool_choice="none",
            max_tokens=150, stream=True)
        pieces = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                read.set()  # the held generator may go on now
                pieces.append(chunk.choices[0].delta.content)
    assert read.is_set() and len(pieces) > 1


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


def test_disconnected_stream_frees_its_worker(model: Any) -> None:
    """A client that goes away ends its turn: the turn below would never end by itself (text
    forever), yet its generator is closed and the worker freed once the client disconnects."""
    closed = threading.Event()

    class Endless(needlepoint.Needle):
        def stream_ids(self, ids: Any, query: str, **options: Any) -> Iterator[Any]:
            try:
                while True:
                    time.sleep(0.01)
                    yield TextDelta("x")
            finally:
                closed.set()

    app = create_app(model, workers=1, model_name=MODEL_ID, needle_factory=Endless)
    with ServerThread(app) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0,
                               timeout=120)
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=user("hello"), tool_choice="none", stream=True)
        for n, _ in enumerate(stream):
            if n == 3:
                break
        stream.close()
        assert closed.wait(60), "the endless turn was not stopped"
        deadline = time.monotonic() + 60  # a liveness bound, not a speed requirement
        while server.health()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.health()["in_flight"] == 0
