"""No request field is silently ignored: each OpenAI field is honoured, accepted at its
neutral value, or refused with a 400 naming it; unknown fields too. Error messages name the
field and what it allows instead of leaking numpy / pydantic internals; empty queries are a
400. Setup and helpers: `server_helpers.py`."""

# ruff: noqa: F811  (module-scoped fixtures imported from server_helpers, requested by name)

from __future__ import annotations

import typing
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import completion_create_params
from server_helpers import (  # noqa: F401 (fixtures, requested by name)
    MODEL_ID,
    WEATHER,
    ServerThread,
    check_error,
    client,
    model,
    server,
    user,
)

from needlepoint.server.fields import REFUSED, RULES
from needlepoint.server.schemas import ChatCompletionRequest

TOOLS = [{"type": "function", "function": WEATHER}]


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    request = {"model": MODEL_ID, "messages": user("weather in Oslo"), "tools": TOOLS,
               "max_tokens": 8, **kwargs}
    return client.chat.completions.create(**request)


def test_every_openai_field_is_declared() -> None:
    """Each field the official client can send is a declared request field, so none can fall
    through as ignored (the policy for each is in `needlepoint.server.fields`)."""
    fields = set(typing.get_type_hints(completion_create_params.CompletionCreateParamsBase))
    declared = set(ChatCompletionRequest.model_fields)
    assert fields <= declared, sorted(fields - declared)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"functions": [WEATHER]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"verbosity": "low"}, "verbosity"),
    ({"store": True}, "store"),
    ({"metadata": {"a": "b"}}, "metadata"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"frequency_penalty": 0.3}, "frequency_penalty"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"messages": [{"role": "function", "name": "f", "content": "1"}, *user("hi")]},
     "messages.0.role"),
    ({"messages": [{"role": "user", "content": "hi", "name": "ana"}]}, "messages.0.name"),
    ({"messages": [{"role": "user", "content": "hi", "colour": "red"}]}, "messages.0.colour"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages.0.content"),
    ({"tools": [{"type": "function", "function": {**WEATHER, "extra": 1}}]},
     "tools.0.function.extra"),
])
def test_unsupported_fields_are_refused_by_name(client: openai.OpenAI, kwargs: dict[str, Any],
                                                param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        create(client, **kwargs)
    check_error(err.value, 400, param)
    assert param.split(".")[-1] in err.value.body["message"]


@pytest.mark.parametrize("kwargs", [
    {"user": "u-1", "safety_identifier": "s", "prompt_cache_key": "k"},
    {"store": False, "metadata": {}, "service_tier": "auto", "modalities": ["text"]},
    {"n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}},
    {"tools": [{"type": "function", "function": {**WEATHER, "strict": True}}]},
    {"parallel_tool_calls": True, "logprobs": False, "reasoning_effort": "medium"},
])
def test_neutral_and_identifier_fields_are_accepted(client: openai.OpenAI,
                                                    kwargs: dict[str, Any]) -> None:
    out = create(client, **kwargs)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_every_refused_field_has_a_rule_or_a_reason() -> None:
    for name in REFUSED:
        assert name in ChatCompletionRequest.model_fields
    for name in ("temperature", "top_p", "seed", "tool_choice", "stop", "response_format"):
        assert RULES[name]


# ------------------------------------------------------------------ error messages
def _raw(server: ServerThread, body: bytes, content_type: str = "application/json") -> Any:
    with httpx.Client(timeout=30) as http:
        response = http.post(f"{server.url}/v1/chat/completions", content=body,
                             headers={"content-type": content_type})
    assert response.status_code == 400
    return response.json()["error"]


def test_error_messages_name_the_field_and_what_it_allows(client: openai.OpenAI,
                                                          server: ServerThread) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        create(client, temperature="hot")
    body = err.value.body
    assert body["param"] == "temperature"
    assert "'hot'" in body["message"] and "between 0 and 2" in body["message"]
    # JSON NaN (the official client cannot send it; other clients can).
    nan = _raw(server, b'{"model": "needle3-toy", "messages": [{"role": "user", "content": '
                       b'"hi"}], "temperature": NaN}')
    assert nan["param"] == "temperature" and "nan" in nan["message"]
    assert "between 0 and 2" in nan["message"] and "less than or equal" not in nan["message"]
    with pytest.raises(openai.BadRequestError) as err:
        create(client, tool_choice="sometimes")
    body = err.value.body
    assert body["param"] == "tool_choice" and "'sometimes'" in body["message"]
    assert '"required"' in body["message"] and "literal[" not in body["message"]
    assert "NamedToolChoice" not in body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        create(client, tool_choice={"type": "function"})
    assert err.value.body["param"] == "tool_choice"
    assert "dictionary" not in err.value.body["message"]
    plain = _raw(server, b'{"model": "needle3-toy", "messages": []}', "text/plain")
    assert "Content-Type" in plain["message"] and "application/json" in plain["message"]
    assert "dictionary" not in plain["message"]
    with pytest.raises(openai.BadRequestError) as err:
        create(client, messages=[{"role": "wizard", "content": "hi"}])
    assert err.value.body["param"] == "messages.0.role"
    assert "system, developer, user, assistant, tool" in err.value.body["message"]


@pytest.mark.parametrize("content", ["", "   ", None])
def test_empty_queries_are_a_400(client: openai.OpenAI, server: ServerThread,
                                 content: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        create(client, messages=[{"role": "user", "content": content}])
    check_error(err.value, 400, "messages.0.content", "empty_query")
    root = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        root.post("/needlepoint/complete", body={"text": content or ""}, cast_to=object)
    check_error(err.value, 400, "text", "empty_query")


def test_non_string_content_names_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        create(client, messages=[{"role": "user", "content": 42}])
    assert err.value.body["param"] == "messages.0.content"
    assert "42" in err.value.body["message"]


def test_chat_template_kwargs_on_a_model_without_a_chat_template_is_a_400(client) -> None:
    """`chat_template_kwargs` is honoured for chat-template models (tests/api/
    test_api_families.py); the toy Needle model speaks its own wire format, so it is refused
    with a message that says why, not ignored."""
    with pytest.raises(openai.BadRequestError) as err:
        create(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    check_error(err.value, 400)
    assert "chat-template models" in err.value.body["message"]
