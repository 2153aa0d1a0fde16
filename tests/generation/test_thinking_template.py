"""Qwen3's thinking (issue 28 item 4): with `enable_thinking` on (the template's default) the
answer may start with `<think>...</think>`, streamed as reasoning, then a call or text; with it
off the template has closed the think block in the prompt and the grammar allows none."""

from __future__ import annotations

import json

import pytest
from hf_helpers import hf_reference

from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.generation import answer_grammar
from needlepoint.generation.events import ReasoningDelta, TextDelta, ToolCallDelta

TOOLS = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}},
                                      "required": ["a"]}}]
THOUGHT_CALL = ('<think>\nI could write <tool_call> here.\n</think>\n\n<tool_call>\n'
                '{"name": "f", "arguments": {"a": "x"}}\n</tool_call>')


@pytest.fixture(scope="module")
def tokenizer():
    return open_hf_directory(hf_reference("qwen3-tiny").folder).tokenizer


def _run(tokenizer, fmt, text):
    ids = tokenizer.encode(text, add_special_tokens=False) + [fmt.end_ids[0]]
    grammar = answer_grammar.AnswerGrammar(answer_grammar.token_vocab(fmt), fmt, TOOLS)
    matcher, accepted = grammar.start(), True
    for token in ids:
        if not matcher.allowed_mask()[token]:
            accepted = False
            break
        matcher.advance(token)
    parser = answer_grammar.turn_vocab(fmt).parser(())
    events = [e for token in ids for e in parser.feed(token)] + parser.finish()
    return accepted and matcher.is_finished(), events, parser


def test_thinking_on_streams_reasoning_then_the_call(tokenizer) -> None:
    fmt = TemplateFormat(tokenizer)
    assert fmt.thinking and fmt.think_ids == (tokenizer.marker_id("<think>"),
                                              tokenizer.marker_id("</think>"))
    accepted, events, parser = _run(tokenizer, fmt, THOUGHT_CALL)
    assert accepted
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == "I could write <tool_call> here."
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert "".join(e.text for e in events if isinstance(e, ToolCallDelta)) == parser.call_text
    assert json.loads(parser.call_text) == [{"name": "f", "arguments": {"a": "x"}}]
    accepted, events, _ = _run(tokenizer, fmt, "<think>\nhm\n</think>\n\nHello")
    assert accepted and "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello"


def test_thinking_off_allows_no_think_block(tokenizer) -> None:
    fmt = TemplateFormat(tokenizer, template_kwargs={"enable_thinking": False})
    assert not fmt.thinking
    assert not _run(tokenizer, fmt, THOUGHT_CALL)[0]
    assert _run(tokenizer, fmt, THOUGHT_CALL[THOUGHT_CALL.index("<tool_call>\n"):])[0]
    qwen2 = TemplateFormat(open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer)
    assert not qwen2.thinking  # no think tokens in its vocabulary
