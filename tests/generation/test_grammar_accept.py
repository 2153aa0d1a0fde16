"""Tool-call grammar (needlepoint.grammar), answer by answer: valid calls pass token by token
and byte by byte, invalid ones stop at the first bad byte, special tokens only at the end,
distinct tools in any order, the 64-tool limit, and the no-tool grammar.
Shared setup: `grammar_helpers.py`.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from grammar_helpers import (
    CLOSE,
    EOS,
    IM_END,
    OPEN,
    TOOLS,
    VALID,
    byte_ids,
    encode,
    grammar,
    obj,
    vocab,
    walk,
)

from needlepoint.errors import ToolSchemaError
from needlepoint.generation.grammar import MAX_TOOLS, GrammarError, ToolCallGrammar

BAD = "\u27c2"  # marks the first byte the grammar must reject in an invalid answer


@pytest.mark.parametrize("text", VALID)
def test_valid_answers_accepted_token_by_token(text):
    m = walk(encode(text))
    assert not m.is_finished()
    assert m.calls() == json.loads(text)
    mask = m.allowed_mask()
    assert np.flatnonzero(mask).tolist() == [CLOSE], "only </tool_call> after the array"
    m.advance(CLOSE)
    assert np.flatnonzero(m.allowed_mask()).tolist() == [IM_END]
    m.advance(IM_END)
    assert m.is_finished()
    assert np.flatnonzero(m.allowed_mask()).tolist() == [EOS]


@pytest.mark.parametrize("text", VALID)
def test_valid_answers_accepted_byte_by_byte(text):
    m = walk([byte_ids()[b] for b in text.encode()], masked=False)
    assert m.calls() == json.loads(text)


ALARM_0645 = '[{"name":"set_alarm","arguments":{"time":"06:45",'  # then the other keys
INVALID = {
    "undeclared tool": '[{"name":"get_' + BAD + 'time","arguments":{}}]',
    "undeclared tool, prefix of a name": '[{"name":"get_weath' + BAD + '","arguments":{}}]',
    "repeated tool": '[{"name":"get","arguments":{}},{"name":"get' + BAD + '","arguments":{}}]',
    "repeated tool later": '[{"name":"get_weather","arguments":{"city":"a"}},'
                           '{"name":"get","arguments":{}},{"name":"' + BAD + 'get_weather"',
    "missing required key": '[{"name":"get_weather","arguments":{' + BAD + '}}]',
    "missing required, other key": '[{"name":"set_alarm","arguments":{"' + BAD + 'label":"x"}}]',
    "extra key": '[{"name":"get_weather","arguments":{"city":"Oslo","' + BAD + 'x":1}}]',
    "extra key after last": '[{"name":"get_weather","arguments":{"city":"O","unit":"c"' + BAD
                            + ',"x":1}}]',
    "extra key in empty tool": '[{"name":"get","arguments":{' + BAD + '"a":1}}]',
    "extra nested key": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1' + BAD
                        + ',"x":1}]}}]',
    "keys out of schema order": ALARM_0645 + '"repeat":1' + BAD + ',"label":"x"}}]',
    "wrong type": '[{"name":"get_weather","arguments":{"city":' + BAD + '3}}]',
    "int out of range": ALARM_0645 + '"repeat":1' + BAD + '0}}]',
    "int below minimum": ALARM_0645 + '"repeat":' + BAD + '-1}}]',
    "int not a float": ALARM_0645 + '"repeat":1' + BAD + '.5}}]',
    "enum violation": '[{"name":"get_weather","arguments":{"city":"O","unit":"' + BAD + 'k"}}]',
    "enum overrun": '[{"name":"get_weather","arguments":{"city":"O","unit":"c' + BAD + 'c"}}]',
    "pattern violation": '[{"name":"set_alarm","arguments":{"time":"' + BAD + '6:45"}}]',
    "pattern late violation": '[{"name":"set_alarm","arguments":{"time":"06:' + BAD + '75"}}]',
    "maxLength": ALARM_0645 + '"label":"abcdefghij' + BAD + 'k"}}]',
    "minItems": '[{"name":"order","arguments":{"items":[' + BAD + ']}}]',
    "maxItems": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1},{"sku":"b","qty":1}'
                + BAD + ',{"sku":"c","qty":1}]}}]',
    "nested minimum": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":' + BAD + '0}]}}]',
    "$ref type": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1}],'
                 '"address":{"street":"x","zip":' + BAD + '"1"}}}]',
    "$ref required": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1}],'
                     '"address":{' + BAD + '}}}]',
    "anyOf": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1}],"when":' + BAD
             + 'true}}]',
    "anyOf pattern branch": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1}],'
                            '"when":"2026-7' + BAD + '"}}]',
    "exclusiveMinimum": '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1}],'
                        '"price":0' + BAD + '}}]',
    "whitespace after colon": '[{"name":"get","arguments":' + BAD + ' {}}]',
    "whitespace after [": "[" + BAD + ' {"name":"get","arguments":{}}]',
    "whitespace in arguments": '[{"name":"get_weather","arguments":{"city":' + BAD + ' "O"}}]',
    "whitespace after comma": '[{"name":"get","arguments":{}},' + BAD + ' {"name":"x"}]',
    "newline before ]": '[{"name":"get","arguments":{}}' + BAD + "\n]",
    "arguments before name": '[{"' + BAD + 'arguments":{},"name":"get"}]',
    "not an array": BAD + '{"name":"get","arguments":{}}',
    "null arguments": '[{"name":"get","arguments":' + BAD + "null}]",
    "trailing comma": '[{"name":"get","arguments":{}},' + BAD + "]",
}


@pytest.mark.parametrize("name", INVALID)
def test_invalid_rejected_at_the_first_bad_byte(name):
    text = INVALID[name]
    bad = text.index(BAD)
    data = text.replace(BAD, "").encode()
    at = len(text[:bad].encode())
    # byte by byte: every byte before the mark passes, the marked one fails
    m = walk([byte_ids()[b] for b in data[:at]], masked=False)
    token = byte_ids()[data[at]]
    assert not m.allowed_mask()[token]
    with pytest.raises(GrammarError, match="not allowed"):
        m.advance(token)
    # with the real tokenization: the first rejected token is the one holding that byte
    m, pos = grammar().start(), 0
    for t in encode(data.decode()):
        size = len(vocab().token_bytes[t])
        try:
            m.advance(t)
        except GrammarError:
            assert not m.allowed_mask()[t]
            assert pos <= at < pos + size, (name, pos, size, at)
            break
        pos += size
    else:
        pytest.fail(f"{name}: every token was accepted")
    m.advance(int(np.flatnonzero(m.allowed_mask())[0]))  # a rejection leaves the state usable


def test_special_tokens_only_at_the_end():
    m = grammar().start()
    for t in (EOS, IM_END, CLOSE, OPEN, 0, 2, 3):
        with pytest.raises(GrammarError):
            m.advance(t)
    ids = encode('[{"name":"get_weather","arguments":{"city":"')
    for t in ids:
        m.advance(t)
    mask = m.allowed_mask()
    assert not mask[sorted(vocab().special_ids)].any(), "no special token inside a string"
    assert mask.sum() > 4000, "free text: most of the vocabulary"
    m = walk(encode("[]"))
    for t in (EOS, IM_END):
        with pytest.raises(GrammarError, match="</tool_call>|not allowed"):
            m.advance(t)
    m.advance(CLOSE)
    with pytest.raises(GrammarError):
        m.advance(EOS)
    assert m.forced_tokens() == [IM_END]
    m.advance(IM_END)
    assert m.is_finished()
    m.advance(EOS)
    assert m.is_finished()


def test_every_order_of_distinct_tools_and_no_repeat():
    args = ['{"city":"x"}', '{"time":"01:02"}', "{}", '{"items":[{"sku":"a","qty":1}]}']
    calls = {t["name"]: f'{{"name":"{t["name"]}","arguments":{a}}}'
             for t, a in zip(TOOLS, args, strict=True)}
    rng = random.Random(7)
    names = list(calls)
    for _ in range(10):
        rng.shuffle(names)
        k = rng.randint(1, len(names))
        walk(encode("[" + ",".join(calls[n] for n in names[:k]) + "]") + [CLOSE, IM_END])
    # (not masked: with all four used the `]` is forced, so `}}]` is the canonical token)
    m = walk(encode("[" + ",".join(calls[n] for n in names)), masked=False)
    assert not m.allowed_mask()[byte_ids()[ord(",")]], "all four used: no further call"


def test_sixty_four_tools_and_the_limit():
    tools = [{"name": f"t{i}", "parameters": obj({})} for i in range(MAX_TOOLS)]
    g = ToolCallGrammar(vocab(), tools)
    order = list(range(MAX_TOOLS))[::-1]
    text = "[" + ",".join(f'{{"name":"t{i}","arguments":{{}}}}' for i in order) + "]"
    m = walk(encode(text), g)
    assert len(m.calls()) == MAX_TOOLS
    m = walk(encode(text[:-1]), g, masked=False)
    assert not m.allowed_mask()[byte_ids()[ord(",")]], "all 64 used: only ] may follow"
    with pytest.raises(ToolSchemaError, match="at most 64"):
        ToolCallGrammar(vocab(), [*tools, {"name": "one_more"}])



def test_no_tools_means_only_empty_array():
    g = ToolCallGrammar(vocab(), [])
    m = g.start()
    assert m.forced_tokens() == [*encode("[]"), CLOSE, IM_END]
    m = walk(encode("[]") + [CLOSE, IM_END], g)
    assert m.is_finished() and m.calls() == []

