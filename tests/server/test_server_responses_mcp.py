"""Server-side MCP tools (issue 29 items 2 and 5): `create_app(mcp=...)` (`serve --mcp`) with
the shipped example server (stdio) and the test server over streamable HTTP; the Responses
API's `mcp` tools (`mcp_call` items, `allowed_tools`, `require_approval`, approval requests
and responses, `server_url` only for allowed hosts) and the playground's MCP routes."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from conftest import REPO_ROOT
from mcp_helpers import HttpServer, stdio_server
from server_helpers import MODEL_ID, ServerThread, check_error, model  # noqa: F401

from needlepoint.api.mcp_tools import McpTools
from needlepoint.server import create_app

QUERY = "wake me up at 06:45"
ALARMS = {"type": "mcp", "server_label": "alarms", "require_approval": "never"}


@pytest.fixture(scope="module")
def mcp():
    with McpTools(REPO_ROOT / "examples" / "mcp.json") as tools:
        yield tools


@pytest.fixture(scope="module")
def http_mcp():
    with HttpServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(model, mcp, http_mcp):  # noqa: F811
    app = create_app(model, workers=2, model_name=MODEL_ID, mcp=mcp, mcp_hosts=["127.0.0.1"])
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def items(response, kind):
    return [item for item in response.output if item.type == kind]


def test_never_approval_runs_the_call_on_the_server(client, mcp):
    response = client.responses.create(model=MODEL_ID, input=QUERY, tools=[ALARMS])
    calls = items(response, "mcp_call")
    assert calls and calls[0].name == "set_alarm" and calls[0].server_label == "alarms"
    assert json.loads(calls[0].arguments) == {"time": "06:45"}
    assert json.loads(calls[0].output) == mcp.call("set_alarm", {"time": "06:45"})["result"]
    assert calls[0].error is None and response.status == "completed"
    assert not items(response, "function_call")  # the client runs nothing


def test_approval_is_requested_then_given_or_declined(client):
    tool = {"type": "mcp", "server_label": "alarms"}  # require_approval defaults to always
    first = client.responses.create(model=MODEL_ID, input=QUERY, tools=[tool])
    (request,) = items(first, "mcp_approval_request")
    assert request.name == "set_alarm" and not items(first, "mcp_call")
    approved = client.responses.create(
        model=MODEL_ID, previous_response_id=first.id, tools=[tool],
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id,
                "approve": True}])
    call = items(approved, "mcp_call")[0]
    assert call.id == request.id and json.loads(call.output)["status"] == "set"
    assert approved.output[0] == call and len(approved.output) > 1  # then the model answers
    declined = client.responses.create(
        model=MODEL_ID, previous_response_id=first.id, tools=[tool],
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id,
                "approve": False}])
    call = items(declined, "mcp_call")[0]
    assert call.output is None and "declined" in call.error


def test_allowed_tools_limit_what_the_model_sees(client):
    tool = {**ALARMS, "allowed_tools": ["get_weather"], "require_approval": "always"}
    response = client.responses.create(model=MODEL_ID, input=QUERY, tools=[tool])
    named = [getattr(item, "name", None) for item in response.output]
    assert "set_alarm" not in named
    approval = {"type": "mcp", "server_label": "alarms",
                "require_approval": {"never": {"tool_names": ["set_alarm"]}}}
    response = client.responses.create(model=MODEL_ID, input=QUERY, tools=[approval])
    assert items(response, "mcp_call")[0].name == "set_alarm"  # ran without asking
    assert "set_alarm" not in [item.name for item in items(response, "mcp_approval_request")]


def test_streamed_mcp_call_events(client):
    with client.responses.create(model=MODEL_ID, input=QUERY, tools=[ALARMS],
                                 stream=True) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert "response.mcp_call.completed" in kinds and kinds[-1] == "response.completed"
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert "mcp_call" in added


def test_server_url_only_for_allowed_hosts(client, http_mcp):
    tool = {"type": "mcp", "server_label": "web", "server_url": http_mcp.url,
            "require_approval": "never", "allowed_tools": ["set_alarm"]}
    response = client.responses.create(model=MODEL_ID, input=QUERY, tools=[tool])
    call = items(response, "mcp_call")[0]
    assert call.server_label == "web" and json.loads(call.output)["status"] == "set"
    other = {**tool, "server_url": http_mcp.url.replace("127.0.0.1", "localhost")}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL_ID, input=QUERY, tools=[other])
    check_error(info.value, 400, "tools[0].server_url", "server_url_not_allowed")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL_ID, input=QUERY,
                                tools=[{"type": "mcp", "server_label": "nowhere"}])
    check_error(info.value, 400, "tools[0].server_label", "unknown_mcp_server")


def test_the_playground_routes_list_and_run_mcp_tools(server):
    listed = httpx.get(f"{server.url}/v1/needlepoint/mcp/tools").json()["data"]
    assert [(t["name"], t["server"]) for t in listed] == [("set_alarm", "alarms"),
                                                          ("get_weather", "alarms")]
    reply = httpx.post(f"{server.url}/v1/needlepoint/mcp/call",
                       json={"name": "set_alarm", "arguments": {"time": "07:00"}}).json()
    assert reply["server"] == "alarms" and reply["result"]["time"] == "07:00"
    missing = httpx.post(f"{server.url}/v1/needlepoint/mcp/call", json={"name": "nope"})
    assert missing.status_code == 404
    page = httpx.get(f"{server.url}/").text
    assert 'id="mcp-tools"' in page
    script = httpx.get(f"{server.url}/playground/playground_mcp.js").text
    assert "/v1/needlepoint/mcp/tools" in script and "handed off to" in script


def test_a_dead_server_is_a_502_naming_it(model):  # noqa: F811
    with McpTools({"mcpServers": {"fragile": stdio_server(timeout=3)}}) as tools:
        app = create_app(model, workers=2, model_name=MODEL_ID, mcp=tools)
        with ServerThread(app) as running:
            reply = httpx.post(f"{running.url}/v1/needlepoint/mcp/call",
                               json={"name": "hang", "arguments": {}}, timeout=60)
            assert reply.status_code == 502 and "'fragile'" in reply.json()["error"]["message"]
            reply = httpx.post(f"{running.url}/v1/needlepoint/mcp/call",
                               json={"name": "crash", "arguments": {}}, timeout=60)
            assert reply.status_code == 502 and "'fragile'" in reply.json()["error"]["message"]
