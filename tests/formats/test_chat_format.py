"""Chat formats (`formats/chat_format.py`): Needle's wire format keeps its exact prompts; a
chat template renders conversations, with a Hermes-style tool prompt when it renders no tools
(SmolLM2) and the template's own tools section when it has one (the tiny Llama fixture)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import get_fixture
from hf_helpers import SmolLM2Reference, hf_fixture_dir

from needlepoint.formats.chat_format import NeedleFormat, TemplateFormat
from needlepoint.formats.checkpoints import open_checkpoint

WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def smollm2() -> TemplateFormat:
    return TemplateFormat(open_checkpoint(SmolLM2Reference().path).tokenizer)


# fixtures/needle3/README.md "Prompt wire format": [system turn], then the user turn with the
# tools' compact JSON and the query, then the assistant's opening.
WIRE = re.compile(r"(?:<\|im_start\|>system\n(.*?)<\|im_end\|>\n)?<\|im_start\|>user\n"
                  r"<tools>(.*?)</tools>\n(.*)<\|im_end\|>\n<\|im_start\|>assistant\n", re.S)


def test_needle_format_is_the_wire_format() -> None:
    """First turns give exactly the token ids upstream recorded for the fixture's wire-format
    prompts; a conversation with a call and a tool result is the format's text, written out
    here from the README (the call encoded as training encodes a target: after a dummy-prefix
    piece; later turns continue right after `<|im_end|>`, with no such piece)."""
    import needlepoint

    fixture = get_fixture("needle3", "tiny")
    model = needlepoint.load(fixture.cact)
    fmt, tok = model.chat_format, model.tokenizer
    assert isinstance(fmt, NeedleFormat) and fmt.marker_tokens
    wire = [p for p in fixture.meta["prompts"] if p["target"] is None and "<tools>" in p["text"]]
    assert [p["name"] for p in wire] == ["tool_query", "long_system_multi_tool",
                                         "unicode_byte_fallback"]
    for prompt in wire:
        system, tools, query = WIRE.fullmatch(prompt["text"]).groups()
        assert fmt.first_ids(json.loads(tools), query, system or "") == prompt["token_ids"]
    calls = [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    messages = [{"role": "user", "content": "rain in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "name": "get_weather", "content": {"rain": True}},
                {"role": "user", "content": "thanks"}]
    ids = fmt.conversation_ids(messages, [WEATHER])
    assert tok.decode(ids) == (
        '<|im_start|>user\n<tools>[{"name":"get_weather","description":"Weather of a city.",'
        '"parameters":{"type":"object","properties":{"city":{"type":"string"}},'
        '"required":["city"]}}]</tools>\nrain in Oslo?<|im_end|>\n<|im_start|>assistant\n'
        ' <tool_call>[{"name":"get_weather","arguments":{"city":"Oslo"}}]</tool_call>'
        '<|im_end|>\n<|im_start|>user\n<tool_result>[{"name":"get_weather","result":'
        '{"rain":true}}]</tool_result>\nthanks<|im_end|>\n<|im_start|>assistant\n')
    marker = fixture.meta["tokenizer"]["markers"]
    assert ids[0] == fixture.meta["tokenizer"]["bos_id"]
    assert [ids.count(marker[m]) for m in ("<tool_call>", "<tool_result>", "<|im_end|>")] == \
        [1, 1, 3]
    call_end = ids.index(marker["<|im_end|>"], ids.index(marker["<tool_call>"]))
    assert tok.token_bytes(ids[call_end + 1]) == b"\n"
    assert ids[call_end + 2] == marker["<|im_start|>"]
    with pytest.raises(ValueError, match="starts with a user message"):
        fmt.conversation_ids([{"role": "assistant", "content": "hi"}], [])


def test_smollm2_template_gets_the_hermes_tool_prompt(smollm2) -> None:
    fmt, tok = smollm2, smollm2.tokenizer
    assert not fmt.renders_tools and fmt.uses_tool_prompt
    assert fmt.end_ids == (tok.marker_id("<|im_end|>"),) == (tok.eos_id,)
    text = tok.decode(fmt.first_ids([WEATHER], "rain in Oslo?"))
    listed = json.dumps([{"type": "function", "function": WEATHER}])
    assert text.startswith("<|im_start|>system\nYou are a function calling AI model.")
    assert f"<tools>{listed}</tools>" in text
    assert text.endswith("<|im_end|>\n<|im_start|>user\nrain in Oslo?<|im_end|>\n"
                         "<|im_start|>assistant\n")
    # no tools: the template's own default system turn, nothing about tools
    plain = tok.decode(fmt.first_ids([], "hi"))
    assert "<tools>" not in plain and "named SmolLM" in plain


def test_smollm2_history_with_a_tool_result(smollm2) -> None:
    fmt, tok = smollm2, smollm2.tokenizer
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "rain in Oslo?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
                {"role": "tool", "name": "get_weather", "content": {"rain": True}}]
    text = tok.decode(fmt.conversation_ids(messages, [WEATHER]))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou are a function calling")
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>[{"name": "get_weather", "arguments": {"city": '
        '"Oslo"}}]'
        '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>{"name": "get_weather", '
        '"result": {"rain": true}}</tool_response><|im_end|>\n<|im_start|>assistant\n')
    # the rendered history's ids are the tokenizer's ids of that text (no extra BOS)
    assert fmt.conversation_ids(messages, [WEATHER]) == tok.encode(text)


def test_a_template_that_renders_tools_gets_them() -> None:
    tok = open_checkpoint(hf_fixture_dir("llama-tiny")).tokenizer
    fmt = TemplateFormat(tok)
    assert fmt.renders_tools and not fmt.uses_tool_prompt
    text = tok.decode(fmt.first_ids([WEATHER], "rain in Oslo?"))
    assert "# Tools\n<tools>\n" + json.dumps({"type": "function", "function": WEATHER}) in text
    assert "You are a function calling" not in text
    assert fmt.end_ids[0] == tok.marker_id("<|im_end|>")
