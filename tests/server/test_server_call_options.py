"""Per-request call options through the server, on a scripted template model (the
qwen2-tiny fixture's tokenizer and chat template, logits that spell a chosen answer):
`call_threshold` declines a weak call (and anything but a probability is a 400 naming it),
a tool whose schema the grammar cannot hold is dropped and reported in the `needlepoint`
object instead of failing the request (a 400 only when no tool is usable), and
`parallel_tool_calls: false` gives at most one call."""

from __future__ import annotations

import pytest
from fake_model import ScriptedTemplateModel
from fastapi.testclient import TestClient
from hf_helpers import hf_reference
from server_helpers import streamed_calls

from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.server import create_app

ALARM = {"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm.", "parameters": {
        "type": "object", "properties": {"time": {"type": "string"}}, "required": ["time"]}}}
# strings in an integer's enum: no value can satisfy it (BFCL live_relevance_8-8-0's shape)
TICKETS = {"type": "function", "function": {
    "name": "buy_tickets", "description": "Buy tickets.", "parameters": {
        "type": "object", "properties": {"count": {"type": "integer", "enum": ["1", "2"]}},
        "required": ["count"]}}}
SEATS = {"type": "function", "function": {
    "name": "book_seats", "description": "Book seats.", "parameters": {
        "type": "object", "properties": {"seats": {"type": "integer", "enum": ["3"]}},
        "required": ["seats"]}}}
END = 1101  # the fixture's end-of-turn token as the script's last


def block(time: str) -> str:
    return f'<tool_call>\n{{"name": "set_alarm", "arguments": {{"time": "{time}"}}}}\n' \
           '</tool_call>'


@pytest.fixture(scope="module")
def app_client():
    """Two alarm calls, each token of the script at logit 12 over noise of 0.5: the call
    side gets most, not all, of the first token's probability."""
    tokenizer = open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer
    text = "\n".join([block("06:45"), block("07:00")])
    script = list(tokenizer.encode(text, add_special_tokens=False)) + [END]
    model = ScriptedTemplateModel(tokenizer, script, strength=12.0, noise=0.5,
                                  max_seq_len=2048)
    return TestClient(create_app(model, workers=1, model_name="scripted"))


def ask(client, stream: bool = False, **fields):
    body = {"model": "scripted", "messages": [{"role": "user", "content": "alarms"}],
            "tools": [ALARM], "stream": stream, "max_tokens": 200, **fields}
    return client.post("/v1/chat/completions", json=body)


def calls_of(reply) -> list[tuple[str, str]]:
    message = reply.json()["choices"][0]["message"]
    return [(c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []]


# -- call_threshold ----------------------------------------------------------------------------
def test_a_call_threshold_declines_a_weak_call(app_client):
    called = ask(app_client)
    assert called.status_code == 200, called.text
    assert calls_of(called)[0] == ("set_alarm", '{"time": "06:45"}')
    assert ask(app_client, call_threshold=0.0).json()["choices"][0]["finish_reason"] == \
        "tool_calls"
    declined = ask(app_client, call_threshold=1.0)  # no call is that certain
    assert declined.status_code == 200, declined.text
    message = declined.json()["choices"][0]["message"]
    assert not message.get("tool_calls") and message["content"]
    calls, _ = streamed_calls(ask(app_client, stream=True, call_threshold=1.0))
    assert calls == []


@pytest.mark.parametrize("value", [1.5, -0.1, "0.5", True, None])
def test_a_call_threshold_that_is_not_a_probability_is_a_400_naming_it(app_client, value):
    if value is None:  # null: the default, accepted
        assert ask(app_client, call_threshold=value).status_code == 200
        return
    reply = ask(app_client, call_threshold=value)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "call_threshold"
    assert "call_threshold" in error["message"] and "between 0 and 1" in error["message"]


# -- unusable tools -----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_an_unusable_tool_is_dropped_and_reported(app_client, stream):
    reply = ask(app_client, stream, tools=[TICKETS, ALARM])
    assert reply.status_code == 200, reply.text
    if stream:
        calls, extension = streamed_calls(reply)
    else:
        calls, extension = calls_of(reply), reply.json()["needlepoint"]
    assert calls[0] == ("set_alarm", '{"time": "06:45"}')
    dropped = extension["dropped_tools"]
    assert [d["name"] for d in dropped] == ["buy_tickets"]
    assert "unsatisfiable" in dropped[0]["reason"]


def test_usable_tools_report_nothing_dropped(app_client):
    assert ask(app_client).json()["needlepoint"]["dropped_tools"] == []


@pytest.mark.parametrize("tools", [[TICKETS], [TICKETS, SEATS]])
def test_a_400_only_when_no_tool_is_usable(app_client, tools):
    reply = ask(app_client, tools=tools)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == ("tools", "invalid_tool")
    for tool in tools:
        if len(tools) > 1:
            assert tool["function"]["name"] in error["message"]
    assert "unsatisfiable" in error["message"]


# -- parallel_tool_calls ------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_gives_at_most_one_call(app_client, stream):
    both = ask(app_client, stream)
    one = ask(app_client, stream, parallel_tool_calls=False)
    assert both.status_code == one.status_code == 200
    if stream:
        assert len(streamed_calls(both)[0]) == 2
        assert streamed_calls(one)[0] == [("set_alarm", '{"time": "06:45"}')]
    else:
        assert len(calls_of(both)) == 2
        assert calls_of(one) == [("set_alarm", '{"time": "06:45"}')]
