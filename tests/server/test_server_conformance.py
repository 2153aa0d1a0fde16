"""OpenAI conformance through the official `openai` client: tool_choice="required" always
calls, parallel_tool_calls=false calls at most once, response_format constrains the content,
stop, logprobs / top_logprobs, int64 seeds, reasoning_effort, allowed_tools.
Setup and helpers: `server_helpers.py`."""

# ruff: noqa: F811  (module-scoped fixtures imported from server_helpers, requested by name)

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from server_helpers import (  # noqa: F401 (fixtures, requested by name)
    MODEL_ID,
    calls_of,
    check_error,
    client,
    collect_stream,
    examples,
    free_text,
    model,
    openai_tools,
    server,
    user,
)

import needlepoint

TOOLS = json.loads((Path(__file__).resolve().parents[2] / "examples" / "tools.json").read_text())


def chat(client: openai.OpenAI, query: str, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL_ID, messages=user(query),
                                          tools=openai_tools(TOOLS), **kwargs)


# ------------------------------------------------------------------ tool calls
@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_always_calls(client: openai.OpenAI, stream: bool) -> None:
    plain = chat(client, "tell me a joke")
    assert plain.choices[0].message.tool_calls is None  # what the model does by itself
    if stream:
        out = collect_stream(chat(client, "tell me a joke", tool_choice="required",
                                  stream=True))
        calls, finish = out["calls"], out["finish"]
    else:
        forced = chat(client, "tell me a joke", tool_choice="required")
        calls, finish = calls_of(forced.choices[0].message), forced.choices[0].finish_reason
    assert len(calls) >= 1 and finish == "tool_calls"
    assert {name for name, _ in calls} <= {t["name"] for t in TOOLS}


def test_parallel_tool_calls_false(client: openai.OpenAI) -> None:
    query = "could you set my alarm to 11:05 and after that can you time 8 minutes for me"
    tools = [t for t in TOOLS if t["name"] in ("set_alarm", "set_timer")]
    both = client.chat.completions.create(model=MODEL_ID, messages=user(query),
                                          tools=openai_tools(tools))
    assert len(both.choices[0].message.tool_calls) == 2  # the model calls both by itself
    one = client.chat.completions.create(model=MODEL_ID, messages=user(query),
                                         tools=openai_tools(tools), parallel_tool_calls=False)
    assert len(one.choices[0].message.tool_calls) == 1
    assert one.choices[0].finish_reason == "tool_calls"


def test_allowed_tools_restricts_the_offer(client: openai.OpenAI) -> None:
    choice = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "set_timer"}}]}}
    out = chat(client, "tell me a joke", tool_choice=choice)
    assert [name for name, _ in calls_of(out.choices[0].message)] == ["set_timer"]
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, "hi", tool_choice={"type": "allowed_tools", "allowed_tools": {
            "mode": "auto", "tools": [{"type": "function", "function": {"name": "nope"}}]}})
    assert err.value.body["param"].startswith("tool_choice")


# ------------------------------------------------------------------ response_format
def test_response_format_json_object(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL_ID, messages=user("play some jazz"),
                                         response_format={"type": "json_object"},
                                         max_tokens=60)
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and isinstance(json.loads(choice.message.content),
                                                         dict)


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema(client: openai.OpenAI, stream: bool) -> None:
    schema = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "day": {"type": "string", "enum": ["today", "tomorrow"]}},
        "required": ["city", "day"], "additionalProperties": False}
    kwargs = dict(model=MODEL_ID, messages=user("what is the weather in Paris"), max_tokens=60,
                  response_format={"type": "json_schema", "json_schema": {
                      "name": "forecast", "schema": schema, "strict": True}})
    if stream:
        content = collect_stream(client.chat.completions.create(**kwargs, stream=True))["content"]
    else:
        content = client.chat.completions.create(**kwargs).choices[0].message.content
    jsonschema.validate(json.loads(content), schema)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{**kwargs, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}})
    check_error(err.value, 400, "response_format")


# ------------------------------------------------------------------ stop, logprobs
@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences(client: openai.OpenAI, stream: bool) -> None:
    full = free_text(client, "hello", max_tokens=40).choices[0].message.content
    stop = full[8:11]
    expected = full[: full.index(stop)].rstrip()
    if stream:
        out = collect_stream(free_text(client, "hello", max_tokens=40, stop=[stop], stream=True))
        content, finish = out["content"], out["finish"]
    else:
        choice = free_text(client, "hello", max_tokens=40, stop=stop).choices[0]
        content, finish = choice.message.content, choice.finish_reason
    assert content == expected and finish == "stop"


def test_logprobs_match_the_model(client: openai.OpenAI, model: Any) -> None:
    out = free_text(client, "hello", max_tokens=12, logprobs=True, top_logprobs=3)
    choice = out.choices[0]
    entries = choice.logprobs.content
    assert entries and "".join(e.token for e in entries) == choice.message.content
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and entry.logprob <= tops[0] + 1e-12
        assert sum(math.exp(t) for t in tops) <= 1 + 1e-9
    # Independently: the first answer token's log-softmax straight from a model session.
    needle = needlepoint.Needle(model=model)
    logits = model.session().prefill(needle.prompt_ids("hello")).astype(np.float64)
    top = logits.max()
    logz = top + math.log(np.exp(logits - top).sum())
    assert entries[0].top_logprobs[0].logprob == pytest.approx(top - logz, abs=1e-6)
    streamed = free_text(client, "hello", max_tokens=12, logprobs=True, top_logprobs=3,
                         stream=True)
    got = [e.logprob for chunk in streamed for c in chunk.choices if c.logprobs
           for e in c.logprobs.content]
    assert got == pytest.approx([e.logprob for e in entries])
    plain = free_text(client, "hello", max_tokens=12)
    assert plain.choices[0].logprobs is None


# ------------------------------------------------------------------ seeds
def test_negative_seeds_are_distinct_and_reproducible(client: openai.OpenAI) -> None:
    hot = dict(temperature=1.5, max_tokens=30)
    texts = {s: free_text(client, "hello", seed=s, **hot).choices[0].message.content
             for s in (-5, -6, -1000)}
    assert len(set(texts.values())) == 3  # they used to collapse to one stream
    assert free_text(client, "hello", seed=-5, **hot).choices[0].message.content == texts[-5]
    free_text(client, "hello", seed=-(2**63), **hot)  # the whole int64 range is accepted
    free_text(client, "hello", seed=2**63 - 1, **hot)
    for bad in (2**63, -(2**63) - 1):
        with pytest.raises(openai.BadRequestError) as err:
            free_text(client, "hello", seed=bad)
        check_error(err.value, 400, "seed")


def test_reasoning_effort_sets_the_budget(client: openai.OpenAI) -> None:
    # "hello" with tools makes the toy ramble before it calls; no reasoning budget means the
    # call is forced at once: nothing but the call.
    out = chat(client, "hello", reasoning_effort="none")
    assert out.choices[0].message.content is None or out.choices[0].message.content == ""
    assert out.choices[0].finish_reason in ("tool_calls", "stop")
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, "hello", reasoning_effort="extreme")
    check_error(err.value, 400, "reasoning_effort")
