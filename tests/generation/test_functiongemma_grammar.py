"""FunctionGemma's call syntax as a constraint (issue 28 item 4): the whole-answer grammar of
the gemma3-tiny fixture accepts exactly `<start_function_call>call:NAME{...}<end_function_call>`
built from the tool schemas (strings inside `<escape>`, bare numbers, booleans, null, nested
objects and lists, only declared tools, required keys present), the chat example's own answer
included, and the turn parser reads it back as JSON calls; Qwen's `<tool_call>` blocks are laid
out as its template lays them out."""

from __future__ import annotations

import json

import pytest
from hf_helpers import hf_reference

from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.generation import answer_grammar

TOOLS = [
    {"name": "set_alarm", "parameters": {"type": "object", "properties": {
        "time": {"type": "string"}, "label": {"type": "string"}}, "required": ["time"]}},
    {"name": "plan", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"},
        "none": {"type": "null"}, "mode": {"enum": ["a", "b c"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"},
                                                  "city": {"type": "string"}},
                  "required": ["city"]},
        "extra": {"type": "object"}}, "required": ["n"]}},
]


@pytest.fixture(scope="module")
def gemma():
    ref = hf_reference("gemma3-tiny")
    tokenizer = open_hf_directory(ref.folder).tokenizer
    fmt = TemplateFormat(tokenizer)
    return tokenizer, fmt, answer_grammar.token_vocab(fmt), answer_grammar.turn_vocab(fmt)


def _ids(tokenizer, fmt, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + [fmt.end_ids[0]]


def _accepts(grammar, ids) -> bool:
    matcher = grammar.start()
    for token in ids:
        if not matcher.allowed_mask()[token]:
            return False
        matcher.advance(token)
    return matcher.is_finished()


def _call(body: str) -> str:
    return f"<start_function_call>{body}<end_function_call>"


def test_the_chat_example_answer_is_accepted_and_parsed(gemma) -> None:
    tokenizer, fmt, vocab, turn = gemma
    example = json.loads((hf_reference("gemma3-tiny").folder / "chat_example.json").read_text())
    rendered = example["rendered"]
    start = rendered.index("<start_function_call>", rendered.index("Wake me"))
    answer = rendered[start : rendered.rindex("<end_function_call>") + 19]
    grammar = answer_grammar.AnswerGrammar(vocab, fmt, [t for t in example["tools"]])
    ids = _ids(tokenizer, fmt, answer)
    assert _accepts(grammar, ids)
    parser = turn.parser(())
    for token in ids:
        parser.feed(token)
    parser.finish()
    assert json.loads(parser.call_text) == [c["function"] for c in
                                            example["messages"][1]["tool_calls"]]


@pytest.mark.parametrize("body", [
    "call:set_alarm{time:<escape>06:45<escape>}",
    "call:set_alarm{time:<escape><escape>,label:<escape>x, y}{<escape>}",
    "call:plan{n:3}",
    "call:plan{n:-12,x:1.5e-3,ok:false,none:null,mode:<escape>b c<escape>,"
    "tags:[<escape>a<escape>,<escape>b<escape>],where:{lat:2,city:<escape>Oslo<escape>},"
    "extra:{k:[1,true,{z:null}],w:<escape>v<escape>}}",
    "call:plan{n:0,tags:[],extra:{}}",
])
def test_valid_calls_are_accepted(gemma, body) -> None:
    tokenizer, fmt, vocab, _ = gemma
    grammar = answer_grammar.AnswerGrammar(vocab, fmt, TOOLS)
    assert _accepts(grammar, _ids(tokenizer, fmt, _call(body)))


@pytest.mark.parametrize("body", [
    "call:other{n:3}",                                   # undeclared tool
    "call:set_alarm{label:<escape>x<escape>}",           # required key missing
    "call:set_alarm{time:06:45}",                        # string without <escape>
    'call:set_alarm{time:"06:45"}',                      # JSON string
    "call:plan{n:1.5}",                                  # integer expected
    "call:plan{n:3,mode:<escape>c<escape>}",             # not in the enum
    "call:plan{n:3,ok:True}",                            # booleans are lower case
    "call:plan{n:3,where:{lat:2}}",                      # nested required key missing
    "call:plan{n:3,bogus:1}",                            # undeclared key
    "call:plan{mode:<escape>a<escape>,n:3}",             # keys in schema order
    'call:plan{"n":3}',                                  # quoted key
])
def test_invalid_calls_are_rejected(gemma, body) -> None:
    tokenizer, fmt, vocab, _ = gemma
    grammar = answer_grammar.AnswerGrammar(vocab, fmt, TOOLS)
    assert not _accepts(grammar, _ids(tokenizer, fmt, _call(body)))


def test_parallel_calls_follow_one_another(gemma) -> None:
    tokenizer, fmt, vocab, _ = gemma
    two = _call("call:plan{n:1}") + _call("call:set_alarm{time:<escape>7<escape>}")
    assert _accepts(answer_grammar.AnswerGrammar(vocab, fmt, TOOLS), _ids(tokenizer, fmt, two))
    single = answer_grammar.AnswerGrammar(vocab, fmt, TOOLS, parallel_calls=False)
    assert not _accepts(single, _ids(tokenizer, fmt, two))
    assert _accepts(single, _ids(tokenizer, fmt, _call("call:plan{n:1}")))


def test_required_call_excludes_text_and_text_excludes_the_marker(gemma) -> None:
    tokenizer, fmt, vocab, _ = gemma
    text = _ids(tokenizer, fmt, "Sure, at six.")
    assert _accepts(answer_grammar.AnswerGrammar(vocab, fmt, TOOLS), text)
    assert not _accepts(answer_grammar.AnswerGrammar(vocab, fmt, TOOLS, text=False,
                                                     require_call=True), text)


def test_qwen_blocks_as_the_template_lays_them_out() -> None:
    tokenizer = open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer
    fmt = TemplateFormat(tokenizer)
    grammar = answer_grammar.AnswerGrammar(answer_grammar.token_vocab(fmt), fmt, TOOLS[:1])
    block = '<tool_call>\n{"name": "set_alarm", "arguments": {"time": "7"}}\n</tool_call>'
    assert _accepts(grammar, _ids(tokenizer, fmt, block))
    assert _accepts(grammar, _ids(tokenizer, fmt, f"{block}\n{block}"))
    assert not _accepts(grammar, _ids(tokenizer, fmt, block.replace("\n", "")))
