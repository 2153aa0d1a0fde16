"""Shared pieces of the tool-call grammar tests (`test_grammar_*.py`): the SentencePiece
model and vocabulary, the special ids, a set of tools covering the schema features, the
grammar over them, `walk` and the valid answers.

Token ids come from the shipped fixture's SentencePiece model (the archive tokenizer's
source); one test checks that `TokenVocab.from_tokenizer` on the archives agrees with it.
Design and numbers: docs/grammar.md.
"""

from __future__ import annotations

from functools import cache

import pytest
import sentencepiece as spm
from conftest import fixtures_dir

from needlepoint.generation.grammar import TokenVocab, ToolCallGrammar

EOS, OPEN, CLOSE, IM_END = 1, 10, 11, 5  # needle3 ids (fixture README "Tokenizer")


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
