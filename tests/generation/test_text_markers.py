"""Call markers matched as text (`generation/text_markers.py`), the explicit first-token
choice of `tool_choice="auto"`, and the whole-answer grammar of a template model
(`generation/answer_grammar.py`) over SmolLM2's real tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_helpers import SmolLM2Reference

from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.formats.checkpoints import open_checkpoint
from needlepoint.generation.answer_grammar import AnswerGrammar, token_vocab, turn_vocab
from needlepoint.generation.events import TextDelta, ToolCallDelta
from needlepoint.generation.grammar import GrammarError
from needlepoint.generation.segments import MarkerIds
from needlepoint.generation.syntaxes import syntax_for
from needlepoint.generation.text_markers import TextMarkerParser, explicit_choice

PIECES = [b"<", b"tool", b"_call", b">", b"[", b"{}", b"]", b"</", b"tool_call>", b"Hi", b" <",
          b"x", b"", b"\n"]
END = PIECES.index(b"")
MARKERS = MarkerIds(-1, -1, -1, -1, im_end=END, eos=END)
TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}},
         {"name": "set_alarm", "parameters": {"type": "object", "properties": {
             "time": {"type": "string"}}, "required": ["time"]}}]


def feed(parser: TextMarkerParser, pieces: list[bytes]) -> list:
    events = []
    for piece in pieces:
        events += parser.feed(PIECES.index(piece))
    return events + parser.finish()


def test_text_with_a_partial_marker_is_held_then_released() -> None:
    parser = TextMarkerParser(PIECES, MARKERS, strip_dummy_space=False)
    events = feed(parser, [b"Hi", b" <", b"x"])
    assert "".join(e.text for e in events) == "Hi <x" and parser.call_text is None
    assert all(isinstance(e, TextDelta) for e in events)


def test_a_marker_split_over_tokens_opens_and_closes_the_call() -> None:
    parser = TextMarkerParser(PIECES, MARKERS, strip_dummy_space=False)
    events = feed(parser, [b"<", b"tool", b"_call", b">", b"[", b"{}", b"]", b"</",
                           b"tool_call>", b""])
    assert parser.call_text == "[{}]" and parser.call_closed and not parser.text
    assert "".join(e.text for e in events if isinstance(e, ToolCallDelta)) == "[{}]"


def test_object_body_blocks_are_reported_as_one_list() -> None:
    parser = TextMarkerParser(PIECES, MARKERS, strip_dummy_space=False, body="object")
    block = [b"<", b"tool", b"_call", b">", b"{}", b"</", b"tool_call>"]
    feed(parser, [*block, b"\n", *block, b""])
    assert json.loads(parser.call_text) == [{}, {}] and parser.call_closed


def test_explicit_choice_picks_call_or_text_by_the_marker_probability() -> None:
    allowed = np.array([True, True, True, False])
    call_start = np.array([True, False, False, True])
    logits = np.log(np.array([0.05, 0.6, 0.3, 0.05]))
    assert explicit_choice(allowed, logits, call_start, 0.01).tolist() == \
        [True, False, False, False]
    assert explicit_choice(allowed, logits, call_start, 0.1).tolist() == \
        [False, True, True, False]
    only_call = np.array([True, False, False, False])  # required: nothing to choose
    assert explicit_choice(only_call, logits, call_start, 0.5) is only_call


@pytest.fixture(scope="module")
def smollm2():
    fmt = TemplateFormat(open_checkpoint(SmolLM2Reference().path).tokenizer)
    return fmt, token_vocab(fmt)


def accept(grammar: AnswerGrammar, tokenizer, text: str):
    matcher = grammar.start()
    for token in tokenizer.encode(text, add_special_tokens=False):
        matcher.advance(token)
    return matcher


def test_auto_grammar_allows_a_call_or_text_then_the_end(smollm2) -> None:
    fmt, vocab = smollm2
    tok = fmt.tokenizer
    grammar = AnswerGrammar(vocab, fmt, TOOLS)
    call = accept(grammar, tok, '<tool_call>[{"name": "get_weather", "arguments": '
                  '{"city": "Oslo"}}, {"name": "set_alarm", "arguments": {"time": "7"}}]'
                  '</tool_call>')
    assert call.allowed_mask()[tok.eos_id]
    text = accept(grammar, tok, "It is sunny.")
    assert text.allowed_mask()[tok.eos_id]
    with pytest.raises(GrammarError):  # text never turns into a call later
        accept(grammar, tok, "Sure <tool_call>[")
    with pytest.raises(GrammarError):  # names are the declared tools only
        accept(grammar, tok, '<tool_call>[{"name": "get_time"')
    with pytest.raises(GrammarError):  # arguments follow the schema
        accept(grammar, tok, '<tool_call>[{"name": "get_weather", "arguments": {"town"')
    # the same tool twice (OpenAI parallel calls: the weather of two cities)
    twice = accept(grammar, tok, '<tool_call>[{"name": "get_weather", "arguments": {"city": '
                   '"A"}}, {"name": "get_weather", "arguments": {"city": "B"}}]</tool_call>')
    assert twice.allowed_mask()[tok.eos_id]


def test_required_single_and_schema_answers(smollm2) -> None:
    fmt, vocab = smollm2
    tok = fmt.tokenizer
    required = AnswerGrammar(vocab, fmt, TOOLS, text=False, require_call=True)
    first = required.start().allowed_mask()
    assert first[tok.encode("<")[0]] and not first[tok.encode("It")[0]]
    with pytest.raises(GrammarError):  # a required call is not `[]`
        accept(required, tok, "<tool_call>[]")
    single = AnswerGrammar(vocab, fmt, TOOLS, parallel_calls=False)
    with pytest.raises(GrammarError):
        accept(single, tok, '<tool_call>[{"name": "get_weather", "arguments": {"city": "A"}},')
    schema = AnswerGrammar(vocab, fmt, TOOLS, call=False,
                           schema={"type": "object", "properties": {"n": {"type": "integer"}},
                                   "required": ["n"]})
    assert accept(schema, tok, '{"n":3}').allowed_mask()[tok.eos_id]  # response_format: compact
    with pytest.raises(GrammarError):
        accept(schema, tok, "It is")


def test_calls_are_written_as_json_dumps_writes_them(smollm2) -> None:
    """`{"name": ..., "arguments": ...}` with `", "` and `": "`, the style of the prompt's
    example and of templates' `tojson`: the compact style is not offered."""
    fmt, vocab = smollm2
    with pytest.raises(GrammarError):
        accept(AnswerGrammar(vocab, fmt, TOOLS), fmt.tokenizer, '<tool_call>[{"name":"')


def test_turn_vocab_of_a_template_model(smollm2) -> None:
    fmt, _ = smollm2
    vocab = turn_vocab(fmt)
    assert vocab.text_markers == ("<tool_call>", "</tool_call>")
    assert vocab.markers.im_end == vocab.markers.eos == fmt.tokenizer.eos_id
    assert vocab.call_start[fmt.tokenizer.encode("<")[0]]
    assert not vocab.call_start[fmt.tokenizer.encode("It")[0]]
    assert not vocab.free_mask[fmt.tokenizer.marker_id("<|im_start|>")]


def test_a_call_near_the_token_budget_is_closed_not_cut() -> None:
    from needlepoint.generation.text_markers import CLOSE_RESERVE, close_when_short, closing_mask

    pieces = [b"abc", b'"', b"}]", b"</", b"tool_call>", b"x", b", "]
    closing = closing_mask(pieces)
    allowed = np.array([True, True, True, False, False, True, True])
    assert close_when_short(allowed, closing, CLOSE_RESERVE + 1) is allowed  # plenty left
    assert close_when_short(allowed, closing, 3).tolist() == [False, True, True, False,
                                                               False, False, False]
    comma = np.array([True, False, False, False, False, True, True])  # a key must follow
    assert close_when_short(comma, closing, 3).tolist() == [False] * 6 + [True]
    marker = np.array([False, False, False, True, False, True, False])  # the marker next
    assert close_when_short(marker, closing, 3).tolist() == [False, False, False, True,
                                                              False, False, False]
    key = np.array([True, False, False, False, False, False, False])  # a forced key
    assert close_when_short(key, closing, 3) is key
    # a small budget keeps a quarter of itself, not the whole reserve
    assert close_when_short(allowed, closing, 13, budget=48) is allowed
    assert not close_when_short(allowed, closing, 12, budget=48)[0]


def test_object_body_grammar_of_a_template_with_tools() -> None:
    from hf_helpers import hf_fixture_dir

    fmt = TemplateFormat(open_checkpoint(hf_fixture_dir("llama-tiny")).tokenizer)
    assert syntax_for(fmt).body == "object"
    grammar = AnswerGrammar(token_vocab(fmt), fmt, TOOLS)
    tok = fmt.tokenizer
    done = accept(grammar, tok, '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}'
                  '</tool_call>\n<tool_call>{"name": "set_alarm", "arguments": {"time": "7"}}'
                  "</tool_call>")
    assert done.allowed_mask()[fmt.end_ids[0]]  # then the template's <|im_end|>
    with pytest.raises(GrammarError):  # one object per block, not a list
        accept(grammar, tok, "<tool_call>[")
