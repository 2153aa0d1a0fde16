"""Tool and response schemas the fuzzer got through (issue 22, item 5) and the runaway
integer of item 4: each a clean 400 naming the path before any token, or a bounded answer.
Setup and helpers: `server_helpers.py`."""

# ruff: noqa: F811

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from server_helpers import (  # noqa: F401 (fixtures, requested by name)
    MODEL_ID,
    check_error,
    client,
    model,
    server,
    user,
)
from turn_helpers import CITY_WEATHER


def with_property(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    params = {"type": "object", "properties": {"city": schema}, "required": ["city"], **extra}
    return {"type": "function", "function": {**CITY_WEATHER, "parameters": params}}


def nested_list(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}


def refuse(client: openai.OpenAI, tool: dict[str, Any], stream: bool) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL_ID, messages=user("weather in Oslo"),
                                       tools=[tool], stream=stream)
    check_error(err.value, 400, "tools", "invalid_tool")
    return err.value.body


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 2**64},
    {"type": "string", "maxLength": 2**64 - 1},
    {"type": "string", "maxLength": 10**30},
    {"type": "array", "items": {"type": "string"}, "maxItems": 2**64},
    {"type": "integer", "minimum": 2**64},
    {"type": "integer", "minimum": -(2**70)},
    {"type": "string", "enum": ["a"], "x-data": [2**64]},
])
def test_integers_past_64_bits_are_a_clean_400(client, schema, stream):
    body = refuse(client, with_property(schema), stream)
    assert "#/properties/city/" in body["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("where", ["unknown", "default", "enum"])
def test_deep_nesting_is_a_clean_400(client, server, where, stream):
    deep = nested_list(491)
    schema = {"type": "string", "x-extra": deep} if where == "unknown" else \
        {"type": "string", "default": deep} if where == "default" else \
        {"type": "array", "enum": [deep]}
    body = refuse(client, with_property(schema), stream)
    assert "nested deeper than" in body["message"]
    # Deeper, as raw JSON: up to what the JSON parser reads, the schema check refuses it;
    # past that (5000 levels), the body is refused as unparsable, still a 400 error object.
    for depth, code in ((900, "invalid_tool"), (5000, None)):
        raw = {"model": MODEL_ID, "messages": user("hi"), "stream": stream,
               "tools": [with_property({"type": "string", "x": "__DEEP__"})]}
        text = json.dumps(raw).replace('"__DEEP__"', "[" * depth + "]" * depth)
        response = httpx.post(f"{server.url}/v1/chat/completions", content=text,
                              headers={"content-type": "application/json"}, timeout=60)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error"
        if code is not None:
            assert error["code"] == code


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("params", "path"), [
    ({"type": "object", "properties": {"city": {"$ref": "#/$defs/a"}}, **LOOP}, "#/$defs/a"),
    ({"type": "object", "properties": {"city": {"$ref": "#/properties/city"}}},
     "#/properties/city"),
    ({"type": "object", "properties": {"city": {"allOf": [{"$ref": "#/properties/city"}]}}},
     "#/properties/city"),
    ({"type": "object", "properties": {"city": {"anyOf": [{"$ref": "#/$defs/a"}]}}, **LOOP},
     "#/$defs/a"),
])
def test_ref_loops_are_refused_before_the_first_token(client, params, path, stream):
    tool = {"type": "function", "function": {**CITY_WEATHER, "parameters": params}}
    body = refuse(client, tool, stream)  # a 400, streaming included: no 200 then an error
    assert path in body["message"] and "$ref loop" in body["message"]
    assert "<state>" not in body["message"] and len(body["message"]) < 400


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, **LOOP},
     ["#/$defs/a", "$ref loop"]),
    ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 2**64}}},
     ["#/properties/a/maxLength", "64-bit"]),
    ({"type": "object", "x": nested_list(491)}, ["nested deeper than"]),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "[z-a]"}}},
     ["#/properties/a/pattern", "invalid regex"]),
])
def test_bad_response_format_schemas_are_refused(client, schema, words):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODEL_ID, messages=user("hi"), stream=stream,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": schema}})
        check_error(err.value, 400, "response_format", "invalid_response_format")
        assert all(word in err.value.body["message"] for word in words)


def test_recursion_through_the_data_is_still_accepted(client):
    tree = {"type": "object", "properties": {"city": {"type": "string"},
                                             "near": {"type": "array",
                                                      "items": {"$ref": "#"}}},
            "required": ["city"]}
    tool = {"type": "function", "function": {**CITY_WEATHER, "parameters": tree}}
    reply = client.chat.completions.create(model=MODEL_ID, messages=user("weather in Oslo"),
                                           tools=[tool], tool_choice="required",
                                           max_tokens=60)
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


@pytest.mark.parametrize("stream", [False, True])
def test_an_invalid_regex_says_what_is_wrong(client, stream):
    body = refuse(client, with_property({"type": "string", "pattern": "([a-z"}), stream)
    assert "#/properties/city/pattern" in body["message"]
    assert "unclosed character class" in body["message"]


PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_an_unbounded_integer_stays_in_int64(client):
    """The bundled model wrote `"age":111111…` until max_tokens; bounded to int64 it stops
    after at most 19 digits and the answer is JSON matching the schema."""
    for query in ("age of Bob 1111", "Ada is 36 years old; give name and age"):
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=user(query), max_tokens=200,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON}})
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        value = json.loads(choice.message.content)
        assert set(value) == {"name", "age"} and -(2**63) <= value["age"] < 2**63


def test_a_structured_answer_cut_by_max_tokens_says_length(client):
    for stream in (False, True):
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=user("age of Bob 1111"), max_tokens=8, stream=stream,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON}})
        if stream:
            chunks = list(reply)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and
                      c.choices[0].finish_reason]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert finish == ["length"]
        else:
            assert reply.choices[0].finish_reason == "length"
            text = reply.choices[0].message.content
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
