"""No call lost, one argument formatting and null content, through the server: a scripted
template model (the qwen2-tiny fixture's tokenizer and chat template, logits that spell a
chosen answer) that calls two alarms, then repeats the first. The non-streamed and the
streamed answer both end with the two calls made, as `tool_calls`, arguments spaced as
`json.dumps` writes them, `content` null, and the confidences per call in the extension."""

from __future__ import annotations

import json

import pytest
from fake_model import ScriptedTemplateModel
from fastapi.testclient import TestClient
from hf_helpers import hf_reference
from server_helpers import streamed_calls

from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.server import create_app

TOOL = {"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm.", "parameters": {
        "type": "object", "properties": {"time": {"type": "string"}}, "required": ["time"]}}}


@pytest.fixture(scope="module")
def app_client():
    tokenizer = open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer

    def block(time: str) -> str:
        return f'<tool_call>\n{{"name": "set_alarm", "arguments": {{"time": "{time}"}}}}\n' \
               '</tool_call>'

    text = "\n".join([block("06:45"), block("07:00"), block("06:45"), block("08:00")])
    script = list(tokenizer.encode(text, add_special_tokens=False)) + [1101]
    model = ScriptedTemplateModel(tokenizer, script, strength=40.0, noise=0.5,
                                  max_seq_len=2048)
    return TestClient(create_app(model, workers=1, model_name="scripted"))


def ask(client, stream: bool):
    body = {"model": "scripted", "messages": [{"role": "user", "content": "alarms"}],
            "tools": [TOOL], "stream": stream, "max_tokens": 200}
    return client.post("/v1/chat/completions", json=body)


def test_a_repeated_call_ends_the_answer_the_same_way_streamed_or_not(app_client):
    reply = ask(app_client, False)
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    assert message["content"] is None
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert calls == [("set_alarm", '{"time": "06:45"}'), ("set_alarm", '{"time": "07:00"}')]
    assert reply.json()["choices"][0]["finish_reason"] == "tool_calls"

    streamed = ask(app_client, True)
    assert streamed.status_code == 200
    streamed_list, extension = streamed_calls(streamed)
    assert streamed_list == calls
    assert len(extension["call_confidences"]) == 2


def text_app(answer: str) -> TestClient:
    tokenizer = open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer
    script = list(tokenizer.encode(answer, add_special_tokens=False)) + [1101]
    model = ScriptedTemplateModel(tokenizer, script, strength=40.0, noise=0.5,
                                  max_seq_len=2048)
    return TestClient(create_app(model, workers=1, model_name="scripted"))


def both(client) -> tuple[dict, list[dict]]:
    message = ask(client, False).json()["choices"][0]["message"]
    streamed = ask(client, True)
    chunks = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    return message, chunks


@pytest.mark.parametrize("answer", [
    '{"name": "set_alarm", "arguments": {"time": "06:45"}}',
    '```json\n{"name": "set_alarm", "arguments": {"time": "06:45"}}\n```'])
def test_a_json_call_written_as_text_is_a_call(answer):
    message, chunks = both(text_app(answer))
    assert message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in
            message["tool_calls"]] == [("set_alarm", '{"time": "06:45"}')]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                      if c.get("choices"))
    assert content == ""
    streamed = [call for c in chunks if c.get("choices")
                for call in c["choices"][0]["delta"].get("tool_calls") or []]
    assert streamed[0]["function"]["name"] == "set_alarm"
    assert "".join(c["function"].get("arguments", "") for c in streamed) == '{"time": "06:45"}'


def test_json_naming_an_undeclared_tool_stays_text():
    answer = '{"name": "hello", "arguments": {"message": "Hi"}}'
    message, chunks = both(text_app(answer))
    assert message["content"] == answer and not message.get("tool_calls")
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                      if c.get("choices"))
    assert content == answer


def test_the_non_streamed_completion_carries_the_extension_object(app_client):
    body = ask(app_client, False).json()
    extension = body["needlepoint"]
    assert extension["confidence_source"] == "tokens"
    assert len(extension["call_confidences"]) == len(body["choices"][0]["message"]["tool_calls"])


def test_the_served_name_is_the_path_given_not_a_link_target(tmp_path):
    from needlepoint.models.hub import resolve_model_path
    from needlepoint.server.cli import served_name

    target = tmp_path / "blobs" / "sha256-0123abcd.gguf"
    target.parent.mkdir()
    target.write_bytes(b"GGUF")
    link = tmp_path / "qwen2.5-coder-0.5b.gguf"
    link.symlink_to(target)
    assert served_name(resolve_model_path(link)) == "qwen2.5-coder-0.5b"
    folder = tmp_path / "Qwen2.5-0.5B"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert served_name(resolve_model_path(folder)) == "Qwen2.5-0.5B"
