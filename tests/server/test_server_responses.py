"""`POST /v1/responses` (issue 29 item 4) through the official `openai` client's
`client.responses.create` (plain, streamed, multi-turn with a function result, structured
text) and the OpenAI Agents SDK running an agent with a Python function tool. Expected calls
come from the library (`Needle.complete` on the same query and tools), so the route is
checked to add nothing and lose nothing."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from server_helpers import MODEL_ID, ServerThread, check_error, model  # noqa: F401

from needlepoint.api.needle import Needle
from needlepoint.server import create_app

ALARM = {"type": "function", "name": "set_alarm", "description": "Set an alarm at a time of day.",
         "parameters": {"type": "object", "properties": {"time": {"type": "string"},
                                                         "label": {"type": "string"}},
                        "required": ["time"]}}
QUERY = "wake me up at 06:45"


@pytest.fixture(scope="module")
def server(model):  # noqa: F811
    with ServerThread(create_app(model, workers=2, model_name=MODEL_ID)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def expected_calls(model) -> list[dict]:  # noqa: F811
    tool = {k: ALARM[k] for k in ("name", "description", "parameters")}
    return Needle(tools=[tool], model=model).complete(QUERY)["function_calls"]


def test_function_call_matches_the_library(client, model):  # noqa: F811
    response = client.responses.create(model=MODEL_ID, input=QUERY, tools=[ALARM])
    assert response.status == "completed" and response.object == "response"
    calls = [item for item in response.output if item.type == "function_call"]
    assert [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls] == \
        expected_calls(model)
    assert calls[0].call_id and response.usage.input_tokens > 0


def test_streaming_follows_the_documented_event_sequence(client, model):  # noqa: F811
    with client.responses.create(model=MODEL_ID, input=QUERY, tools=[ALARM],
                                 stream=True) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    for name in ("response.output_item.added", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):
        assert name in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == expected_calls(model)[0]["arguments"]
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(pieces) == done.arguments  # streamed as decoded, adding up to the call
    assert len(pieces) > 1
    assert events[-1].response.output[0].type == "function_call"


def test_streamed_text_deltas_add_up_to_the_answer(client):
    with client.responses.create(model=MODEL_ID, input="say hello", tool_choice="none",
                                 max_output_tokens=12, stream=True) as stream:
        events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output[0].type == "message"
    assert final.output[0].content[0].text == deltas == final.output_text
    assert "response.output_text.done" in [e.type for e in events]


def test_multi_turn_with_a_function_result_and_previous_response_id(client):
    first = client.responses.create(model=MODEL_ID, input=QUERY, tools=[ALARM])
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(
        model=MODEL_ID, previous_response_id=first.id, tools=[ALARM],
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": json.dumps({"status": "set"})}])
    assert second.status == "completed" and second.previous_response_id == first.id
    assert second.output  # the model answered the result (text or another call)
    # the same conversation sent whole, without previous_response_id, is accepted too
    whole = client.responses.create(model=MODEL_ID, tools=[ALARM], input=[
        {"role": "user", "content": QUERY},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "done"}])
    assert whole.status == "completed"


def test_json_schema_text_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    response = client.responses.create(
        model=MODEL_ID, input="Paris", instructions="Answer with JSON.",
        text={"format": {"type": "json_schema", "name": "place", "schema": schema}},
        max_output_tokens=40)
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text)["city"], str)
    else:
        assert response.incomplete_details.reason == "max_output_tokens"


def test_errors_in_openai_shape(client, server):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL_ID, input=QUERY, previous_response_id="resp_nope")
    check_error(info.value, 400, "previous_response_id", "previous_response_not_found")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL_ID, input=[{"type": "computer_call"}])
    check_error(info.value, 400, "input[0].type", "unsupported_input_item")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL_ID, input=QUERY,
                                tools=[{"type": "mcp", "server_label": "nowhere",
                                        "server_url": "http://example.com/mcp"}])
    check_error(info.value, 400, "tools[0].server_url", "server_url_not_allowed")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other-model", input=QUERY)
    reply = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL_ID, "input": "hi",
                                                           "bogus": 1})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "bogus"


def test_metrics_count_the_route(server, client):
    client.responses.create(model=MODEL_ID, input=QUERY, tools=[ALARM])
    text = httpx.get(f"{server.url}/metrics").text
    assert 'route="/v1/responses"' in text


def test_openai_agents_sdk_runs_a_function_tool(server):
    """The toy model is trained for one call, not for answering a tool's result: the agent
    stops at its first tool (`tool_use_behavior`), whose output is the final output."""
    import agents  # openai-agents, in the `test` extra

    ran: list[str] = []

    @agents.function_tool
    def set_alarm(time: str, label: str = "") -> str:
        """Set an alarm at a time of day."""
        ran.append(time)
        return f"alarm set for {time}"

    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    served = agents.OpenAIResponsesModel(model=MODEL_ID, openai_client=client)
    agent = agents.Agent(name="alarms", instructions="", tools=[set_alarm], model=served,
                         tool_use_behavior="stop_on_first_tool")
    agents.set_tracing_disabled(True)
    result = asyncio.run(agents.Runner.run(agent, QUERY, max_turns=3))
    assert ran == ["06:45"]
    assert result.final_output == "alarm set for 06:45"


def test_api_keys_guard_the_route(model):  # noqa: F811
    app = create_app(model, workers=2, model_name=MODEL_ID, api_keys=["k-29"])
    with ServerThread(app) as server:
        with pytest.raises(openai.AuthenticationError):
            server.client().responses.create(model=MODEL_ID, input=QUERY)
        keyed = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k-29", max_retries=0)
        assert keyed.responses.create(model=MODEL_ID, input=QUERY,
                                      tools=[ALARM]).status == "completed"
