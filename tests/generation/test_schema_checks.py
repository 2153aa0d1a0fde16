"""`check_schema` and `bounded_schema` (generation/schema_checks.py, tool_schema.py) on the
library side, and what `Needle` does with a structured answer cut by max_new_tokens."""

from __future__ import annotations

import json

import pytest
from conftest import toy_model_path

import needlepoint
from needlepoint.api.needle import Needle
from needlepoint.errors import ToolSchemaError
from needlepoint.generation.content import ContentSchemaError
from needlepoint.generation.schema_checks import check_schema
from needlepoint.generation.tool_schema import INT_BOUND, bounded_schema


@pytest.fixture(scope="module")
def toy():
    return needlepoint.load(toy_model_path())


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"allOf": [{"$ref": "#"}]},
    {"anyOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"oneOf": [{"$ref": "#"}]}}},
    {"properties": {"x": {"$ref": "#/$defs/a~1b"}}, "$defs": {"a/b": {"$ref": "#/$defs/a~1b"}}},
])
def test_ref_loops_are_found(schema):
    with pytest.raises(ToolSchemaError, match=r"\$ref loop"):
        check_schema(schema, "tool 'f': parameters")


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
    {"anyOf": [{"$ref": "#"}, {"type": "string"}]},  # one branch reaches a value
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "integer"}},
     "properties": {"x": {"$ref": "#/$defs/a"}}},
    {"properties": {"x": {"$ref": "#/$defs/missing"}}},  # dangling: the engine names it
    {"properties": {"x": {"$ref": "https://example.com/s.json"}}},
])
def test_schemas_that_reach_a_value_pass(schema):
    check_schema(schema, "tool 'f': parameters")


def test_errors_name_the_path_and_the_error_class_is_chosen():
    with pytest.raises(ContentSchemaError, match="#/properties/n/maximum"):
        check_schema({"properties": {"n": {"maximum": 2**63}}}, "response_format",
                     ContentSchemaError)
    check_schema({"properties": {"n": {"maximum": 2**63 - 1, "minimum": -(2**63)}}}, "x")
    with pytest.raises(ToolSchemaError, match="nested deeper than 64"):
        check_schema({"enum": [_deep(65)]}, "x")
    check_schema({"x": _deep(60)}, "x")


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_bounded_schema_bounds_what_is_unbounded_only():
    schema = {"type": "object", "properties": {
        "a": {"type": "integer"},
        "b": {"type": ["number", "null"], "minimum": 0},
        "c": {"type": "integer", "exclusiveMaximum": 10},
        "d": {"type": "string"},
        "e": {"type": "array", "items": {"type": "integer"}}}}
    out = bounded_schema(schema)
    props = out["properties"]
    assert props["a"] == {"type": "integer", "minimum": -INT_BOUND, "maximum": INT_BOUND}
    assert props["b"] == {"type": ["number", "null"], "minimum": 0, "maximum": INT_BOUND}
    assert props["c"] == {"type": "integer", "exclusiveMaximum": 10, "minimum": -INT_BOUND}
    assert props["d"] == {"type": "string"}
    assert props["e"]["items"] == {"type": "integer", "minimum": -INT_BOUND,
                                   "maximum": INT_BOUND}
    assert schema["properties"]["a"] == {"type": "integer"}  # the input is not changed
    assert INT_BOUND < 2**63 and float(INT_BOUND) < 2**63  # exact in f64, below int64 max


PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_a_cut_structured_answer_is_not_returned_as_valid(toy):
    needle = Needle(model=toy)
    cut = needle.complete("age of Bob 1111", allow_call=False, response_format=PERSON,
                          max_new_tokens=8)
    assert cut["stop_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut["text"])
    assert "max_new_tokens" in cut["error"] and "not valid JSON" in cut["error"]
    whole = needle.complete("age of Bob 1111", allow_call=False, response_format=PERSON,
                            max_new_tokens=200)
    assert whole["stop_reason"] != "length" and "error" not in whole
    assert set(json.loads(whole["text"])) == {"name", "age"}


def test_an_engine_error_mid_call_is_one_line(toy, monkeypatch):
    """Were a schema the checks miss to fail inside the engine while the model writes it,
    the error is the engine's first line, not its whole internal state (~1 KB)."""
    import needlepoint.generation.tool_schema as tool_schema
    from needlepoint.generation.grammar import GrammarError, TokenVocab, ToolCallGrammar

    monkeypatch.setattr(tool_schema, "check_schema", lambda *args, **kwargs: None)
    loop = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
            "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}
    tokenizer = toy.tokenizer
    grammar = ToolCallGrammar(TokenVocab.from_tokenizer(tokenizer),
                              [{"name": "f", "description": "d", "parameters": loop}])
    matcher = grammar.start()
    ids = tokenizer.encode('[{"name":"f","arguments":{"x":')
    with pytest.raises(GrammarError) as error:
        for token in ids[1:]:  # without the dummy-prefix space
            matcher.allowed_mask()
            matcher.advance(token)
        matcher.allowed_mask()
    message = str(error.value)
    assert message.startswith("grammar engine error: ") and "\n" not in message
    assert len(message) < 200 and "<state>" not in message
