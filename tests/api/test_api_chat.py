"""One chat object (`api/chat.py`): `Needle`, its hand-off and the server keep and send one
`Chat`, so after a hand-off the local model, the hand-off endpoint and the server all see the
answer the user was given, in the same messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import toy_model_path
from fastapi.testclient import TestClient

import needlepoint
from needlepoint.api.chat import Chat
from needlepoint.api.handoff import Handoff
from needlepoint.server import create_app

TOOL = {"name": "set_alarm", "description": "Set an alarm at a time of day.",
        "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                       "required": ["time"]}}
QUERY = "wake me up at 06:45"
SYSTEM = "user_name: Ana"
REMOTE_CALL = {"name": "set_alarm", "arguments": {"time": "07:30"}}  # not the local answer


class Recording(Handoff):
    """Hands every answer off (below=1) and answers with `REMOTE_CALL`, recording each send."""

    def ask(self, messages, tools, options) -> dict[str, Any]:
        sent = [*getattr(self, "sent", []), (list(messages), list(tools))]
        object.__setattr__(self, "sent", sent)
        call = {"id": "x", "type": "function",
                "function": {"name": REMOTE_CALL["name"],
                             "arguments": json.dumps(REMOTE_CALL["arguments"])}}
        return {"choices": [{"message": {"content": None, "tool_calls": [call]},
                             "finish_reason": "tool_calls"}]}


def recording() -> Recording:
    return Recording("http://127.0.0.1:9/v1", "big", below=1.0)


@pytest.fixture(scope="module")
def model():
    return needlepoint.load(toy_model_path())


def test_the_openai_view_numbers_calls_and_answers_them_in_order() -> None:
    chat = Chat.opened("sys", "q")
    chat.add_answer({"function_calls": [{"name": "a", "arguments": {"x": 1}},
                                        {"name": "b", "arguments": {}}]}, tokens=[1, 2])
    chat.add_tool_results([{"name": "a", "result": {"ok": 1}}, {"name": "b", "error": "no"}])
    chat.add_answer({"text": "done"})
    assert chat.openai_messages() == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "a", "arguments": '{"x": 1}'}},
            {"id": "call_2", "type": "function", "function": {"name": "b", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": 1}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "no"},
        {"role": "assistant", "content": "done"}]
    assert chat.system == "sys" and chat.query == "q" and not chat.first_turn
    assert chat.tokens == {2: [1, 2]}  # only the answer generated here has tokens
    assert not chat.answer_generated  # the last answer ("done") was given from elsewhere


def test_exchanges_are_derived_from_the_messages(model) -> None:
    fmt = model.chat_format
    chat = Chat.opened("", "first")
    chat.add_answer({"function_calls": [REMOTE_CALL]}, tokens=[7, 8, 9])
    chat.add_tool_results([{"name": "set_alarm", "error": "busy"}])
    chat.add_user("and then?")
    exchanges, content = chat.exchanges(fmt)
    assert [(e.user, e.answer) for e in exchanges] == [("first", [7, 8, 9])]
    results = fmt.tool_results_content([{"name": "set_alarm", "error": "busy"}])
    assert content == f"{results}\nand then?"
    with pytest.raises(ValueError, match="does not end with an answer"):
        chat.replace_answer({"text": "again"})  # the chat ends on a user message now


def test_the_local_model_continues_from_the_handed_off_answer(model) -> None:
    handoff = recording()
    needle = needlepoint.Needle(tools=[TOOL], model=model, system=SYSTEM, handoff=handoff)
    first = needle.complete(QUERY)
    assert first["handoff"]["answered"] and first["function_calls"] == [REMOTE_CALL]
    chat = needle.state.chat
    assert chat.turns[1]["tool_calls"] == [REMOTE_CALL]  # the chat holds what was returned
    needle.send_tool_results([{"name": "set_alarm", "result": {"set": "07:30"}}])
    # what the local model was fed for that turn is the whole chat as its format renders it,
    # the hand-off's answer included (not the local answer it had decoded)
    before = Chat(chat.messages[:-1])
    assert needle.state.conversation.ids[:len(needle.chat_ids(before))] == \
        needle.chat_ids(before)
    # and the endpoint was sent the same chat, the returned call and its result included
    messages, tools = handoff.sent[-1]
    assert messages == before.openai_messages() == needle.openai_messages()[:-1]
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == '{"time": "07:30"}'
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1",
                           "content": '{"set": "07:30"}'}
    assert tools == [TOOL]


def test_needle_and_the_server_hand_off_the_same_messages(model) -> None:
    handoff = recording()
    needle = needlepoint.Needle(tools=[TOOL], model=model, system=SYSTEM, handoff=handoff)
    needle.complete(QUERY)
    needle.send_tool_results([{"name": "set_alarm", "result": {"set": "07:30"}}])
    by_needle = handoff.sent[-1]

    served = recording()
    app = create_app(model, model_name="toy", handoff=served, workers=1)
    call = {"id": "c9", "type": "function",
            "function": {"name": "set_alarm", "arguments": '{"time": "07:30"}'}}
    body = {"model": "toy", "tools": [{"type": "function", "function": TOOL}], "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUERY},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c9", "content": '{"set": "07:30"}'}]}
    with TestClient(app) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["X-Needlepoint-Handoff"].endswith("answered=true")
    assert served.sent == [by_needle]


def test_a_failed_turn_leaves_the_chat_as_it_was(model) -> None:
    needle = needlepoint.Needle(tools=[TOOL], model=model)
    needle.complete(QUERY)
    before = [dict(m) for m in needle.state.chat.messages]
    with pytest.raises(ValueError):
        needle.chat("and another at 07:00", temperature=-1.0)
    assert needle.state.chat.messages == before  # not a user turn without its answer
    needle.chat("and another at 07:00")
    assert [m["role"] for m in needle.state.chat.messages] == ["user", "assistant"] * 2
