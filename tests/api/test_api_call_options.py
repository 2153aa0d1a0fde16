"""`Needle`'s per-call `call_threshold` and its unusable tools, on a scripted template model
(the qwen2-tiny fixture's tokenizer and chat template; logits that spell one alarm call):
a threshold above the call's probability gives a text answer; a tool whose schema the
grammar cannot hold is left out of the prompt and the grammar and named in the envelope's
`dropped_tools`, and only a list with no usable tool raises."""

from __future__ import annotations

import pytest
from fake_model import ScriptedTemplateModel
from hf_helpers import hf_reference

from needlepoint import ToolSchemaError
from needlepoint.api.needle import Needle
from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.generation.grammar import MAX_TOOLS

ALARM = {"name": "set_alarm", "description": "Set an alarm.", "parameters": {
    "type": "object", "properties": {"time": {"type": "string"}}, "required": ["time"]}}
TICKETS = {"name": "buy_tickets", "description": "Buy tickets.", "parameters": {
    "type": "object", "properties": {"count": {"type": "integer", "enum": ["1", "2"]}},
    "required": ["count"]}}


@pytest.fixture(scope="module")
def model():
    tokenizer = open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer
    text = '<tool_call>\n{"name": "set_alarm", "arguments": {"time": "06:45"}}\n</tool_call>'
    script = list(tokenizer.encode(text, add_special_tokens=False)) + [1101]
    return ScriptedTemplateModel(tokenizer, script, strength=12.0, noise=0.5,
                                 max_seq_len=2048)


def test_call_threshold_is_a_per_call_option(model):
    needle = Needle(tools=[ALARM], model=model, max_new_tokens=40)
    called = needle.complete("wake me at 6:45")
    assert called["type"] == "call"
    assert called["function_calls"] == [{"name": "set_alarm", "arguments": {"time": "06:45"}}]
    route = called["decisions"][0]
    assert route["kind"] == "route" and 0.0 < route["prob"] < 1.0
    kept = needle.complete("wake me at 6:45", call_threshold=route["prob"] / 2)
    assert kept["function_calls"] == called["function_calls"]
    declined = needle.complete("wake me at 6:45", call_threshold=1.0)
    assert declined["type"] != "call" and not declined.get("function_calls")
    with pytest.raises(ValueError, match="call_threshold"):
        needle.complete("wake me at 6:45", call_threshold=2)


def test_an_unusable_tool_is_dropped_and_named(model):
    needle = Needle(tools=[TICKETS, ALARM], model=model, max_new_tokens=40)
    assert [spec.name for spec in needle.tools] == ["set_alarm"]
    assert "buy_tickets" not in model.tokenizer.decode(needle.prompt_ids("wake me at 6:45"))
    envelope = needle.complete("wake me at 6:45")
    assert envelope["function_calls"][0]["name"] == "set_alarm"
    assert [d["name"] for d in envelope["dropped_tools"]] == ["buy_tickets"]
    assert "unsatisfiable" in envelope["dropped_tools"][0]["reason"]
    assert "dropped_tools" not in Needle(tools=[ALARM], model=model).complete("wake me")


def test_no_usable_tool_raises(model):
    with pytest.raises(ToolSchemaError, match="unsatisfiable"):
        Needle(tools=[TICKETS], model=model)
    # tools that each compile alone but not together are not dropped: the limit is refused
    many = [{**ALARM, "name": f"alarm_{k}"} for k in range(MAX_TOOLS + 1)]
    with pytest.raises(ToolSchemaError, match=f"at most {MAX_TOOLS}"):
        Needle(tools=many, model=model, retrieve_k=None)
