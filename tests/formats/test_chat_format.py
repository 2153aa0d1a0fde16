"""Chat formats (`formats/chat_format.py`): Needle's wire format keeps its exact prompts; a
chat template renders conversations, with a Hermes-style tool prompt when it renders no tools
(SmolLM2) and the template's own tools section when it has one (the tiny Llama fixture)."""

from __future__ import annotations

import json

import pytest
from conftest import toy_model_path
from hf_helpers import SmolLM2Reference, hf_fixture_dir

from needlepoint.formats.chat_format import NeedleFormat, TemplateFormat
from needlepoint.formats.checkpoints import open_checkpoint
from needlepoint.formats.needle_wire import (
    compact_json,
    continuation_ids,
    prompt_ids,
    render_prompt,
    render_tool_results,
    render_user_turn,
)

WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def smollm2() -> TemplateFormat:
    return TemplateFormat(open_checkpoint(SmolLM2Reference().path).tokenizer)


def test_needle_format_is_the_wire_format() -> None:
    import needlepoint

    model = needlepoint.load(toy_model_path())
    fmt = model.chat_format
    tok = model.tokenizer
    assert isinstance(fmt, NeedleFormat) and fmt.marker_tokens
    assert fmt.first_ids([WEATHER], "rain in Oslo?", "locale: nb") == prompt_ids(
        tok, render_prompt([WEATHER], "rain in Oslo?", "locale: nb"))
    calls = [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    messages = [{"role": "user", "content": "rain in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "name": "get_weather", "content": {"rain": True}},
                {"role": "user", "content": "thanks"}]
    results = render_tool_results([{"name": "get_weather", "result": {"rain": True}}])
    expected = (prompt_ids(tok, render_prompt([WEATHER], "rain in Oslo?"))
                + tok.encode(f"<tool_call>{compact_json(calls)}</tool_call>")
                + [tok.marker_id("<|im_end|>")]
                + continuation_ids(tok, render_user_turn(f"{results}\nthanks")))
    assert fmt.conversation_ids(messages, [WEATHER]) == expected
    with pytest.raises(ValueError, match="starts with a user message"):
        fmt.conversation_ids([{"role": "assistant", "content": "hi"}], [])


def test_smollm2_template_gets_the_hermes_tool_prompt(smollm2) -> None:
    fmt, tok = smollm2, smollm2.tokenizer
    assert not fmt.renders_tools and not fmt.marker_tokens and fmt.call_body == "list"
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
    assert fmt.renders_tools and fmt.call_body == "object"
    text = tok.decode(fmt.first_ids([WEATHER], "rain in Oslo?"))
    assert "# Tools\n<tools>\n" + json.dumps({"type": "function", "function": WEATHER}) in text
    assert "You are a function calling" not in text
    assert fmt.end_ids[0] == tok.marker_id("<|im_end|>")
