"""The server on bad input: 4xx with an OpenAI-style error object for bad requests and
bodies, a 500 error object for an engine failure, and the server keeps serving.
Setup and helpers: `server_helpers.py`.
"""

# The shared module-scoped fixtures (client, examples, model, server) are imported from
# server_helpers and requested by name as test parameters, which pyflakes reads as shadowing.
# ruff: noqa: F811

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_helpers import (  # noqa: F401 (fixtures, requested by name)
    MAX_BODY,
    MODEL_ID,
    WEATHER,
    ServerThread,
    ask,
    check_error,
    client,
    collect_stream,
    examples,
    free_text,
    model,
    server,
    user,
)

import needlepoint
from needlepoint.server import create_app

# ---------------------------------------------------------------------------------------------
# Bad input: 4xx with an OpenAI-style error object, and the server keeps serving
# ---------------------------------------------------------------------------------------------


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
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),  # OpenAI's limit is 4
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


class ExplodingNeedle(needlepoint.Needle):
    """A real Needle whose generation fails after its first delta (an engine bug)."""

    def stream_ids(self, ids: Any, query: str, **options: Any) -> Iterator[Any]:
        events = super().stream_ids(ids, query, **options)
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
