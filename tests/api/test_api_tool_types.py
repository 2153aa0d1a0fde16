"""Tool schemas derived with pydantic (`TypeAdapter(hint).json_schema()`): `Field`
constraints, dates, unions, `Literal`, `Enum`, nested models; the docstring's parameter
descriptions still land, and arguments are converted back to the hinted types. The schemas
compile into the grammar, and the grammar enforces the constraints."""

from __future__ import annotations

import datetime
import enum
from typing import Annotated, Literal

import jsonschema
import pydantic
import pytest
from turn_helpers import toy_grammar_vocab, toy_tokenizer  # noqa: F401 (fixtures, requested by name)

from needlepoint.api.tools import to_tool_spec
from needlepoint.generation.grammar import GrammarError, ToolCallGrammar


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Item(pydantic.BaseModel):
    sku: str
    qty: int = pydantic.Field(ge=1)


def pay(amount: Annotated[float, pydantic.Field(gt=0, le=10000, description="USD")],
        when: datetime.date, who: int | str, mode: Literal["card", "cash"], color: Color,
        items: list[Item], note: str | None = None) -> str:
    """Pay for a basket.

    Args:
        amount: overridden by the Field's own description
        when: The day to pay on.
        items: What is bought.
    """
    return f"{amount!r} {when!r} {who!r} {mode} {color!r} {items!r} {note!r}"


def union_tool(x: int | str) -> str:  # once refused ("only Optional[T]"), now an anyOf
    return repr(x)


def test_field_constraints_reach_the_schema():
    props = to_tool_spec(pay).parameters["properties"]
    # The issue's example: it used to become a bare {"type": "number"}.
    assert props["amount"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 10000,
                               "description": "USD"}
    assert props["when"] == {"type": "string", "format": "date",
                             "description": "The day to pay on."}
    assert props["who"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["mode"] == {"type": "string", "enum": ["card", "cash"]}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["items"]["items"] == {"$ref": "#/$defs/Item"}
    assert props["items"]["description"] == "What is bought."
    assert props["note"] == {"type": "string"}  # Optional: not required, never null
    params = to_tool_spec(pay).parameters
    assert params["required"] == ["amount", "when", "who", "mode", "color", "items"]
    assert params["$defs"]["Item"]["properties"]["qty"] == {"minimum": 1, "type": "integer"}
    assert "title" not in str(params)
    jsonschema.Draft202012Validator.check_schema(params)


def test_union_is_an_any_of():
    spec = to_tool_spec(union_tool)
    assert spec.parameters["properties"]["x"] == {"anyOf": [{"type": "integer"},
                                                            {"type": "string"}]}
    assert spec.call({"x": 3}) == "3" and spec.call({"x": "a"}) == "'a'"


def test_arguments_are_converted_to_the_hinted_types():
    out = to_tool_spec(pay).call({"amount": 5, "when": "2024-05-01", "who": 3, "mode": "card",
                                  "color": "red", "items": [{"sku": "a", "qty": 2}]})
    assert out == ("5.0 datetime.date(2024, 5, 1) 3 card <Color.RED: 'red'> "
                   "[Item(sku='a', qty=2)] None")
    with pytest.raises(pydantic.ValidationError):  # the function never runs on bad input
        to_tool_spec(pay).call({"amount": 5, "when": "not a date", "who": 1, "mode": "card",
                                "color": "red", "items": []})


def test_the_grammar_enforces_the_field_constraints(tokenizer, grammar_vocab):
    grammar = ToolCallGrammar(grammar_vocab, [to_tool_spec(pay).schema()])
    opener = tokenizer.marker_id("<tool_call>")

    def _walk(grammar, text):
        ids = tokenizer.encode("<tool_call>" + text)
        m = grammar.start()
        for token in ids[ids.index(opener) + 1:]:
            m.advance(token)
        return m

    head = '[{"name":"pay","arguments":{"amount":'
    rest = ',"when":"2024-05-01","who":"me","mode":"cash","color":"blue","items":[]}}]'
    _walk(grammar, head + "12.5" + rest)  # inside (0, 10000]
    for bad in ("0", "10001", "-3"):
        with pytest.raises(GrammarError):
            _walk(grammar, head + bad + rest)
    with pytest.raises(GrammarError):  # not a Literal value
        _walk(grammar, head + '1,"when":"2024-05-01","who":1,"mode":"cheque"')
