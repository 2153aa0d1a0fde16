"""Shared pieces of the server tests (`test_server_*.py`): uvicorn in a background thread,
the module-scoped model / server / client / examples fixtures, and request and response
helpers.

uvicorn runs in a background thread on a free loopback port and is stopped with
`should_exit`; requests go through the official `openai` client (raw httpx only for bodies
the client cannot produce: malformed JSON, an oversized body). Expected answers come from
the library itself (`needlepoint.Needle`), so the server is checked to add nothing and lose
nothing. Greedy decoding throughout unless a test is about sampling.

The fixtures are module-scoped: a test module imports them by name, and each such module
gets its own model and server.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import uvicorn
from conftest import toy_model_path

import needlepoint
from needlepoint.server import create_app

MODEL_ID = "needle3-toy"
MAX_BODY = 256 * 1024
# A one-argument tool the server tests offer (OpenAI `function` shape).
WEATHER = {"name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


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



def free_text(client: openai.OpenAI, query: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL_ID, messages=user(query), tool_choice="none", **kwargs
    )


def check_error(err: Any, status: int, param: str | None = None, code: str | None = None) -> None:
    assert err.status_code == status
    body = err.body
    assert isinstance(body, dict) and body["message"] and body["type"]
    assert {"message", "type", "param", "code"} <= body.keys()
    if param is not None:
        assert body["param"] == param
    if code is not None:
        assert body["code"] == code


def streamed_calls(reply: Any) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """(calls, the `needlepoint` object) of a streamed reply."""
    chunks = [json.loads(line[len("data: "):]) for line in reply.text.splitlines()
              if line.startswith("data: {")]
    names: dict[int, str] = {}
    parts: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            for call in choice["delta"].get("tool_calls") or []:
                if call["function"].get("name"):
                    names[call["index"]] = call["function"]["name"]
                parts.setdefault(call["index"], []).append(call["function"].get("arguments", ""))
    extension = next(c["needlepoint"] for c in chunks if "needlepoint" in c)
    return [(names[i], "".join(parts[i])) for i in sorted(parts)], extension
