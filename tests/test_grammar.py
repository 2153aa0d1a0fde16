"""Tool-call grammar (needlepoint.grammar): valid calls pass token by token, invalid ones stop
at the first bad byte, bad tool schemas raise ToolSchemaError, and a seeded property test
walks 240 random tool sets to completion and validates what comes out with jsonschema.

Token ids come from the shipped fixture's SentencePiece model (the archive tokenizer's
source); one test checks that `TokenVocab.from_tokenizer` on the archives agrees with it.
Design and numbers: docs/grammar.md.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from functools import cache

import jsonschema
import numpy as np
import pytest
import sentencepiece as spm
from conftest import fixtures_dir, get_fixture

from needlepoint.cact import open_archive
from needlepoint.errors import TokenizerError, ToolSchemaError
from needlepoint.grammar import (
    MAX_TOOLS,
    GrammarError,
    TokenVocab,
    ToolCallGrammar,
)

EOS, OPEN, CLOSE, IM_END = 1, 10, 11, 5  # needle3 ids (fixture README "Tokenizer")
BAD = "\u27c2"  # marks the first byte the grammar must reject in an invalid answer


@cache
def sp() -> spm.SentencePieceProcessor:
    path = fixtures_dir("needle3") / "shipped.tokenizer.model"
    if not path.is_file():
        pytest.fail(f"fixture missing: {path}")
    return spm.SentencePieceProcessor(model_file=str(path))


def encode(text: str) -> list[int]:
    """Ids of `text` as it follows `<tool_call>` (no dummy prefix), as in training."""
    ids = sp().encode("<tool_call>" + text)
    return ids[ids.index(OPEN) + 1 :]


def sp_vocab(model: spm.SentencePieceProcessor) -> tuple[list[bytes], list[int]]:
    """Token bytes as the archive tokenizer defines them, from the SentencePiece model."""
    out, special = [], []
    for i in range(model.get_piece_size()):
        piece = model.id_to_piece(i)
        if model.is_control(i) or model.is_unknown(i):
            special.append(i)
            out.append(b"")
        elif model.is_byte(i):
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            if piece.startswith("<") and piece.endswith(">") and len(piece) > 2 and \
                    model.encode(piece) == [model.piece_to_id("\u2581"), i]:
                special.append(i)  # a user-defined chat marker
            out.append(piece.replace("\u2581", " ").encode())
    return out, special


@cache
def vocab() -> TokenVocab:
    token_bytes, special = sp_vocab(sp())
    return TokenVocab(token_bytes, special, EOS, (CLOSE, IM_END), encode)


@cache
def byte_ids() -> dict[int, int]:
    """byte -> the id the tokenizer uses for it alone: the one-character piece where one
    exists (the byte piece is its non-canonical twin), else the byte piece."""
    out = {int(sp().id_to_piece(i)[3:5], 16): i for i in range(sp().get_piece_size())
           if sp().is_byte(i)}
    for b in range(0x80):
        ids = encode(chr(b))
        if len(ids) == 1:
            out[b] = ids[0]
    return out


def obj(props: dict, required: list[str] | None = None, **extra) -> dict:
    schema = {"type": "object", "properties": props, **extra}
    if required is not None:
        schema["required"] = required
    return schema


TOOLS = [
    {"name": "get_weather", "description": "Weather for a city.",
     "parameters": obj({"city": {"type": "string"},
                        "unit": {"type": "string", "enum": ["c", "f"]}}, ["city"])},
    {"name": "set_alarm", "description": "Set an alarm.",
     "parameters": obj({"time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$",
                                 "format": "time"},
                        "label": {"type": "string", "maxLength": 10},
                        "repeat": {"type": "integer", "minimum": 0, "maximum": 7}}, ["time"])},
    {"name": "get", "description": "A name that prefixes another.", "parameters": obj({})},
    {"name": "order", "description": "Nested structures.",
     "parameters": {
         "type": "object",
         "$defs": {"addr": obj({"street": {"type": "string"}, "zip": {"type": "integer"}},
                               ["street"])},
         "properties": {
             "items": {"type": "array", "minItems": 1, "maxItems": 2,
                       "items": obj({"sku": {"type": "string"},
                                     "qty": {"type": "integer", "minimum": 1}}, ["sku", "qty"])},
             "address": {"$ref": "#/$defs/addr"},
             "when": {"anyOf": [{"type": "integer", "minimum": 0},
                                {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}]},
             "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 99.5},
             "gift": {"type": ["boolean", "null"]},
         },
         "required": ["items"]}},
]


@cache
def grammar() -> ToolCallGrammar:
    return ToolCallGrammar(vocab(), TOOLS)


def walk(ids: list[int], g: ToolCallGrammar | None = None, masked: bool = True):
    """Advance through ids; with `masked`, each must also be in the mask (true for the
    tokenizer's own encoding, not for arbitrary spellings such as byte by byte)."""
    m = (g or grammar()).start()
    for t in ids:
        if masked:
            assert m.allowed_mask()[t], (t, m.text())
        m.advance(t)
    return m


VALID = [
    "[]",
    '[{"name":"get","arguments":{}}]',
    '[{"name":"get_weather","arguments":{"city":"Lagos"}}]',
    '[{"name":"get_weather","arguments":{"city":"São \\"Paulo\\"\\n","unit":"f"}}]',
    '[{"name":"set_alarm","arguments":{"time":"06:45","label":"wake 🍷","repeat":7}}]',
    '[{"name":"set_alarm","arguments":{"time":"23:59","repeat":0}},{"name":"get","arguments":{}}]',
    '[{"name":"order","arguments":{"items":[{"sku":"a","qty":1},{"sku":"b","qty":30}],'
    '"address":{"street":"Main","zip":12345},"when":"2026-07","price":0.5,"gift":null}}]',
    '[{"name":"order","arguments":{"items":[{"sku":"a","qty":2}],"when":3,"gift":true}},'
    '{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get","arguments":{}},'
    '{"name":"set_alarm","arguments":{"time":"00:00"}}]',
]


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
    "keys out of schema order": '[{"name":"set_alarm","arguments":{"time":"06:45","repeat":1'
                                + BAD + ',"label":"x"}}]',
    "wrong type": '[{"name":"get_weather","arguments":{"city":' + BAD + '3}}]',
    "int out of range": '[{"name":"set_alarm","arguments":{"time":"06:45","repeat":1' + BAD
                        + '0}}]',
    "int below minimum": '[{"name":"set_alarm","arguments":{"time":"06:45","repeat":' + BAD
                         + '-1}}]',
    "int not a float": '[{"name":"set_alarm","arguments":{"time":"06:45","repeat":1' + BAD
                       + '.5}}]',
    "enum violation": '[{"name":"get_weather","arguments":{"city":"O","unit":"' + BAD + 'k"}}]',
    "enum overrun": '[{"name":"get_weather","arguments":{"city":"O","unit":"c' + BAD + 'c"}}]',
    "pattern violation": '[{"name":"set_alarm","arguments":{"time":"' + BAD + '6:45"}}]',
    "pattern late violation": '[{"name":"set_alarm","arguments":{"time":"06:' + BAD + '75"}}]',
    "maxLength": '[{"name":"set_alarm","arguments":{"time":"06:45","label":"abcdefghij' + BAD
                 + 'k"}}]',
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


def test_vocab_without_encoder_and_bad_ids():
    token_bytes, special = sp_vocab(sp())
    v = TokenVocab(token_bytes, special, EOS, (CLOSE, IM_END))  # greedy stands in for encode
    m = walk(encode('[{"name":"set_'), ToolCallGrammar(v, TOOLS))
    forced = m.forced_tokens()
    assert b'alarm","arguments":{"time":"'.startswith(b"".join(token_bytes[t] for t in forced))
    for t in forced:
        m.advance(t)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        TokenVocab(token_bytes, special, len(token_bytes))
    with pytest.raises(TokenizerError, match="must be special"):
        TokenVocab(token_bytes, special, EOS, (300,))


def test_mask_keeps_forced_text_and_twins_canonical():
    m = walk(encode('[{"'))
    name, n = encode("name"), encode("n")
    assert len(name) == 1 and np.flatnonzero(m.allowed_mask()).tolist() == name
    m.advance(n[0])  # a non-canonical spelling of forced text is still valid text
    m = walk(encode('[{"name":"get_weather","arguments":{"city":"'))
    quote, twin = encode('"')[0], sp().piece_to_id("<0x22>")
    mask = m.allowed_mask()
    assert quote != twin and mask[quote] and not mask[twin]
    assert twin in vocab().twin_ids.tolist()
    m.advance(twin)


def test_forced_tokens_fast_forward_canonically():
    m = walk(encode('[{"name":"set_'))
    forced = m.forced_tokens()
    text = b"".join(vocab().token_bytes[t] for t in forced)
    assert text and b'alarm","arguments":{"time":"'.startswith(text)
    assert forced == encode(text.decode()), "forced ids are the tokenizer's own encoding"
    for t in forced:
        m.advance(t)
    # `[` is forced but not yet a token: it may merge into `[{"` or `[]`
    assert grammar().start().forced_tokens() == []


def test_no_tools_means_only_empty_array():
    g = ToolCallGrammar(vocab(), [])
    m = g.start()
    assert m.forced_tokens() == [*encode("[]"), CLOSE, IM_END]
    m = walk(encode("[]") + [CLOSE, IM_END], g)
    assert m.is_finished() and m.calls() == []


def test_schema_keywords_are_not_confused_with_data():
    # a property named "properties", an enum of objects, explicit additionalProperties: true,
    # a free-form nested object, and "format" as a mere annotation by default
    tool = {"name": "odd", "parameters": obj({
        "properties": {"type": "string"},
        "choice": {"enum": [{"properties": 1}, "x"]},
        "open": {"type": "object", "properties": {"a": {"type": "integer"}},
                 "additionalProperties": True},
        "free": {"type": "object"},
        "when": {"type": "string", "format": "time"},
    }, ["properties"])}
    g = ToolCallGrammar(vocab(), [tool])
    text = ('[{"name":"odd","arguments":{"properties":"p","choice":{"properties":1},'
            '"open":{"a":1,"zz":[1]},"free":{"k":{"j":null}},"when":"06:45"}}]')
    assert walk(encode(text), g).calls()[0]["arguments"]["open"]["zz"] == [1]
    strict = ToolCallGrammar(vocab(), [tool], strict_formats=True)
    with pytest.raises(AssertionError):
        walk(encode(text), strict)  # RFC 3339 full-time needs seconds and an offset
    walk(encode(text.replace("06:45", "06:45:00Z")), strict)


@pytest.mark.parametrize("tools, match", [
    ("not a list", "list of tool dicts"),
    ([["get"]], "expected a dict"),
    ([{"parameters": obj({})}], "'name' must be a non-empty string"),
    ([{"name": ""}], "non-empty string"),
    ([{"name": "a"}, {"name": "a"}], "declared twice"),
    ([{"name": "a", "parameters": "x"}], "'a'.*must be a JSON schema object"),
    ([{"name": "a", "parameters": {"type": "string"}}], "'a'.*object schema"),
    ([{"name": "a", "parameters": obj({"x": {"enum": {1, 2}}})}], "'a'.*not JSON-serialisable"),
    ([{"name": "a", "parameters": obj({"x": {"maximum": float("nan")}})}], "JSON-serialisable"),
    ([{"name": "a", "parameters": obj({"x": {"type": "array", "uniqueItems": True}})}],
     "'a'.*uniqueItems"),
    ([{"name": "a", "parameters": obj({"x": {"not": {"type": "string"}}})}], "'a'.*not"),
    ([{"name": "a", "parameters": obj({"x": {"type": "strin"}})}], "'a'.*strin"),
    ([{"name": "a", "parameters": obj({"x": {"type": "integer", "minimum": 5, "maximum": 3}},
                                      ["x"])}], "'a'.*unsatisfiable"),
    ([{"name": "a", "parameters": obj({"x": {"type": "string", "pattern": "("}})}], "'a'.*regex"),
    ([{"name": "a", "parameters": obj({"x": {"$ref": "#/$defs/nope"}})}], "'a'.*nope"),
    ([{"name": "a", "parameters": obj({"x": {"type": "string"}}, ["y"])}], "'a'.*'y'"),
])
def test_bad_tool_schemas_raise_tool_schema_error(tools, match):
    with pytest.raises(ToolSchemaError, match=match):
        ToolCallGrammar(vocab(), tools)


def test_overlapping_one_of_is_coerced_to_any_of():
    tool = {"name": "n", "parameters": obj({"x": {"oneOf": [{"type": "integer"},
                                                           {"type": "number"}]}}, ["x"])}
    g = ToolCallGrammar(vocab(), [tool])
    assert walk(encode('[{"name":"n","arguments":{"x":3}}]'), g).calls()[0]["arguments"] == {
        "x": 3}  # valid for both branches: a oneOf violation the grammar lets through


def test_unknown_format_only_fails_when_formats_are_enforced():
    tools = [{"name": "a", "parameters": obj({"x": {"type": "string", "format": "colour"}})}]
    ToolCallGrammar(vocab(), tools)
    with pytest.raises(ToolSchemaError, match="colour"):
        ToolCallGrammar(vocab(), tools, strict_formats=True)


def test_mask_logits_and_matcher_independence():
    g = grammar()
    a, b = g.start(), g.start()
    a.advance(encode("[")[0])
    assert b.allowed_mask()[encode("[")[0]] and not b.tokens
    logits = np.zeros(vocab().vocab_size + 5, np.float32)
    a.mask_logits(logits)
    assert np.isneginf(logits[vocab().vocab_size:]).all()
    assert np.array_equal(np.isfinite(logits[: vocab().vocab_size]), a.allowed_mask())
    with pytest.raises(GrammarError, match="logits shape"):
        a.mask_logits(np.zeros(10, np.float32))
    with pytest.raises(GrammarError, match="outside the vocabulary"):
        a.advance(vocab().vocab_size)
    with pytest.raises(GrammarError, match="not complete"):
        a.calls()


@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_vocab_from_archive_tokenizer(name):
    tokenizer = open_archive(get_fixture("needle3", name).cact).tokenizer
    v = TokenVocab.from_tokenizer(tokenizer)
    model = spm.SentencePieceProcessor(
        model_file=str(fixtures_dir("needle3") / f"{name}.tokenizer.model"))
    token_bytes, special = sp_vocab(model)
    never_text = {i for i, b in enumerate(token_bytes) if b[:1] == b"\xff"}  # not UTF-8
    assert v.token_bytes == token_bytes and v.special_ids == frozenset(special) | never_text
    assert (v.eos_id, v.end_ids) == (EOS, (CLOSE, IM_END))
    g = ToolCallGrammar(v, TOOLS)
    text = VALID[-1]
    ids = model.encode("<tool_call>" + text)
    m = g.start()
    for t in ids[ids.index(OPEN) + 1 :] + [CLOSE, IM_END]:
        m.advance(t)
    assert m.is_finished() and m.calls() == json.loads(text)


def test_mask_cost_is_far_below_a_decode_step():
    """A decode step is ~10-20 ms; the mask must cost well under 1 ms (docs/grammar.md)."""
    ids = encode(VALID[-1]) + [CLOSE, IM_END]
    times = []
    for _ in range(3):
        m = grammar().start()
        for t in ids:
            t0 = time.perf_counter()
            m.allowed_mask()
            times.append(time.perf_counter() - t0)
            m.advance(t)
    assert statistics.median(times) < 1e-3, statistics.median(times)


# ---------------------------------------------------------------- property test
NAMES = ["get", "get_weather", "get_weather_hourly", "set", "set_alarm", "send_message",
         "play_music", "find", "find_route", "x", "naïve_tool", "a-b.c"]
PATTERNS = ["^[a-z]{1,6}$", "^[0-2][0-9]:[0-5][0-9]$", "^[A-Z][a-z]{0,5}$", "[0-9]+",
            "^(red|green|blue)$", "^\\d{3}-\\d{4}$"]


def gen_schema(rng: random.Random, depth: int, defs: dict) -> dict:
    """One random value schema; nesting stops at depth 3."""
    kinds = ["string", "string", "integer", "number", "boolean", "null", "enum", "const",
             "pattern", "nullable"]
    if depth < 3:
        kinds += ["array", "object", "object", "anyOf", "oneOf", "ref"]
    kind = rng.choice(kinds)
    if kind == "string":
        s = {"type": "string"}
        lo = rng.choice([0, 0, 1, 3])
        if rng.random() < 0.5:
            s["minLength"] = lo
        if rng.random() < 0.7:
            s["maxLength"] = lo + rng.randint(0, 8)
        return s
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind in ("integer", "number"):
        s = {"type": kind}
        lo = rng.randint(-50, 50)
        if rng.random() < 0.6:
            s["minimum"] = lo
        if rng.random() < 0.6:
            s["maximum"] = lo + rng.randint(0, 200)
        if kind == "number" and rng.random() < 0.3:
            s["exclusiveMinimum"] = s.pop("minimum", lo) - 0.5
        return s
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        pool = ["heat", "cool", "auto", "a b", "é", 0, 7, -3, 2.5, True, None, ""]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["on", 3, False, None, [1, "x"], {"k": "v"}])}
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer", "boolean"]), "null"]}
    if kind == "array":
        s = {"type": "array", "items": gen_schema(rng, depth + 1, defs)}
        lo = rng.randint(0, 2)
        if rng.random() < 0.5:
            s["minItems"] = lo
        if rng.random() < 0.8:
            s["maxItems"] = lo + rng.randint(0, 2)
        return s
    if kind == "anyOf":
        return {"anyOf": [gen_schema(rng, depth + 1, defs) for _ in range(rng.randint(2, 3))]}
    if kind == "oneOf":  # disjoint branches: overlapping ones are coerced to anyOf (a gap)
        types = rng.sample(["string", "integer", "boolean", "null", "array"], rng.randint(2, 3))
        return {"oneOf": [{"type": t} for t in types]}
    if kind == "ref":
        name = f"d{len(defs)}"
        defs[name] = {}  # reserve the name before recursing
        defs[name] = gen_object(rng, depth + 1, defs)
        return {"$ref": f"#/$defs/{name}"}
    return gen_object(rng, depth + 1, defs)


def gen_object(rng: random.Random, depth: int, defs: dict, most: int = 3) -> dict:
    keys = rng.sample(["city", "n", "when", "tags", "properties", "é", "to", "body", "mode",
                       "x1", "volume"], rng.randint(0, most))
    s = {"type": "object", "properties": {k: gen_schema(rng, depth, defs) for k in keys}}
    s["required"] = [k for k in keys if rng.random() < 0.5]
    if rng.random() < 0.2:
        s["additionalProperties"] = False
    return s


def gen_tools(rng: random.Random) -> list[dict]:
    tools = []
    for name in rng.sample(NAMES, rng.randint(1, 4)):
        defs: dict = {}
        params = gen_object(rng, 0, defs, most=5)
        if defs:
            params["$defs"] = defs
        tools.append({"name": name, "description": "generated", "parameters": params})
    return tools


@cache
def closers() -> tuple[np.ndarray, np.ndarray]:
    """Token preference tiers that steer a long walk to the end: tokens ending a string or a
    container (or a special token), then tokens holding any JSON punctuation."""
    tier1 = np.zeros(vocab().vocab_size, bool)
    tier2 = np.zeros(vocab().vocab_size, bool)
    for i, b in enumerate(vocab().token_bytes):
        tier1[i] = i in vocab().special_ids or (b[-1:] in (b'"', b"]", b"}"))
        tier2[i] = any(c in b for c in b'",:]}')
    return tier1, tier2


def no_whitespace_outside_strings(text: str) -> bool:
    in_string = escape = False
    for c in text:
        if in_string:
            escape, in_string = (False, True) if escape else (c == "\\", c != '"')
        elif c in " \t\r\n":
            return False
        elif c == '"':
            in_string = True
    return True


def random_walk(g: ToolCallGrammar, rng: random.Random, patience: int = 60, cap: int = 1500):
    """Uniform among allowed tokens, except: early on, mostly avoid closing tokens (so walks
    make calls and fill optional keys); after `patience` steps, mostly pick closing tokens,
    then punctuation, so every walk ends."""
    m = g.start()
    tier1, tier2 = closers()
    for step in range(cap):
        if m.is_finished():
            return m
        allowed = m.allowed_mask()
        ids = np.flatnonzero(allowed)
        assert ids.size, f"dead end after {m.text()!r}"
        if step < patience:
            keep_going = np.flatnonzero(allowed & ~tier1)
            if keep_going.size and rng.random() < 0.6:
                ids = keep_going
        else:
            for tier in (tier1, tier2):
                preferred = np.flatnonzero(allowed & tier)
                if preferred.size and rng.random() < 0.9:
                    ids = preferred
                    break
        m.advance(int(ids[rng.randrange(ids.size)]))
    pytest.fail(f"walk did not finish in {cap} steps: {m.text()[:300]!r}")


def check_answer(tools: list[dict], m) -> list[dict]:
    """Everything a finished tool-call answer must satisfy (reusable with a real model):
    compact JSON, declared and distinct names, `name` then `arguments`, arguments valid
    under the tool's schema with keys in schema order; returns the calls."""
    assert m.is_finished() and m.tokens[-2:] == [CLOSE, IM_END]
    text = m.text().decode()
    assert no_whitespace_outside_strings(text), text
    calls = json.loads(text)
    by_name = {t["name"]: t["parameters"] for t in tools}
    names = [c["name"] for c in calls]
    assert len(set(names)) == len(names) and set(names) <= set(by_name), names
    for call in calls:
        assert list(call) == ["name", "arguments"], call
        params, args = by_name[call["name"]], call["arguments"]
        jsonschema.Draft202012Validator(params).validate(args)
        declared = list(params.get("properties", {}))
        assert [k for k in declared if k in args] == list(args), "keys out of schema order"
    return calls


@pytest.mark.parametrize("block", range(8))
def test_property_random_walks_produce_valid_calls(block):
    """30 seeded random tool sets per block (240 in all), one random walk each."""
    for seed in range(block * 30, block * 30 + 30):
        rng = random.Random(seed)
        tools = gen_tools(rng)
        m = random_walk(ToolCallGrammar(vocab(), tools), rng)
        try:
            check_answer(tools, m)
        except (AssertionError, jsonschema.ValidationError) as exc:
            raise AssertionError(f"seed {seed}: {m.text()!r}") from exc
