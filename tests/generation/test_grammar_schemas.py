"""Tool-call grammar (needlepoint.grammar) and tool schemas: schema keywords are not confused
with data, bad tool schemas raise ToolSchemaError, overlapping oneOf is coerced to anyOf,
unknown formats only fail when formats are enforced. Shared setup: `grammar_helpers.py`.
"""

from __future__ import annotations

import pytest
from grammar_helpers import encode, obj, vocab, walk

from needlepoint.errors import ToolSchemaError
from needlepoint.generation.grammar import ToolCallGrammar


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

