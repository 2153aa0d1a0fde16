"""The server on SmolLM2 (a chat-template model) through the official `openai` client: a
tool call, the same call streamed, and a multi-turn history with a tool result replayed
through the model's chat template (`Needle.chat_ids`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import REPO_ROOT
from hf_helpers import SmolLM2Reference
from server_helpers import ServerThread, collect_stream

import needlepoint
from needlepoint.server import create_app

TOOLS = [{"type": "function", "function": t}
         for t in json.loads((REPO_ROOT / "examples" / "tools.json").read_text())]
PARIS = [{"role": "user", "content": "what is the weather in Paris"}]


@pytest.fixture(scope="module")
def model():
    return needlepoint.load(SmolLM2Reference().path)


@pytest.fixture(scope="module")
def server(model) -> Iterator[ServerThread]:
    with ServerThread(create_app(model, workers=1, model_name="smollm2")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def test_a_tool_call_and_the_same_call_streamed(client, model) -> None:
    reply = client.chat.completions.create(model="smollm2", messages=PARIS, tools=TOOLS,
                                           tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments["city"] == "Paris"
    expected = needlepoint.Needle(tools=[t["function"] for t in TOOLS], model=model,
                                  cache=None).complete(PARIS[0]["content"], require_call=True)
    assert [(call.function.name, arguments)] == [
        (c["name"], c["arguments"]) for c in expected["function_calls"]]
    streamed = collect_stream(client.chat.completions.create(
        model="smollm2", messages=PARIS, tools=TOOLS, tool_choice="required", stream=True))
    assert streamed["finish"] == "tool_calls"
    assert streamed["calls"] == [(call.function.name, arguments)]


def test_multi_turn_with_a_tool_result(client) -> None:
    messages = PARIS + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "cloudy"}'},
    ]
    reply = client.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS,
                                           tool_choice="none", max_tokens=16)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls
    again = client.chat.completions.create(
        model="smollm2", tools=TOOLS, tool_choice="required",
        messages=messages + [{"role": "assistant", "content": "It is cloudy."},
                             {"role": "user", "content": "set an alarm at 7:00"}])
    (call,) = again.choices[0].message.tool_calls
    assert call.function.name in {t["function"]["name"] for t in TOOLS}
    assert isinstance(json.loads(call.function.arguments), dict)
