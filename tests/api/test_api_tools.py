"""Tool-schema extraction (`needlepoint.tools`): functions, decorators, pydantic models,
dict and OpenAI forms, bad tools, and schema errors at `Needle` construction."""

from __future__ import annotations

import enum
from typing import Literal, Optional

import pydantic
import pytest
from api_helpers import toy_tools
from conftest import toy_model_path

import needlepoint
from needlepoint import ToolSchemaError
from needlepoint.api.needle import Needle
from needlepoint.api.tools import parse_docstring, to_tool_spec, tool_specs


@pytest.fixture(scope="module")
def toy():
    return needlepoint.load(toy_model_path())


# ------------------------------------------------------------------ tool schemas
class Room(enum.Enum):
    KITCHEN = "kitchen"
    BEDROOM = "bedroom"


def set_lights(room: Room, state: Literal["on", "off"],
               brightness: Optional[int] = None,  # noqa: UP045 - the typing form is tested
               tags: list[str] | None = None) -> str:
    """Turn the lights in a room on or off.

    Longer explanation that is part of the description.

    Args:
        room: Which room.
        state (str): on or off,
            as a word.
        brightness: Percent.

    Returns:
        A status line.
    """
    return f"{room.value} {state} {brightness}"


def test_function_schema():
    spec = to_tool_spec(set_lights)
    assert spec.schema() == {
        "name": "set_lights",
        "description": "Turn the lights in a room on or off. Longer explanation that is part "
                       "of the description.",
        "parameters": {
            "type": "object",
            "properties": {
                "room": {"type": "string", "enum": ["kitchen", "bedroom"],
                         "description": "Which room."},
                "state": {"type": "string", "enum": ["on", "off"],
                          "description": "on or off, as a word."},
                "brightness": {"type": "integer", "description": "Percent."},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["room", "state"],
        },
    }
    assert spec.call({"room": "kitchen", "state": "on"}) == "kitchen on None"


def test_decorator_renames_and_keeps_function_callable():
    @needlepoint.tool(name="lights", description="Lights.")
    def f(x: float, flag: bool = False, extra: dict[str, int] | None = None) -> float:
        return x

    spec = to_tool_spec(f)
    assert spec.name == "lights" and spec.description == "Lights."
    assert spec.parameters["properties"] == {
        "x": {"type": "number"}, "flag": {"type": "boolean"},
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}}}
    assert f(2.0) == 2.0


class Address(pydantic.BaseModel):
    city: str
    zip_code: str


class Booking(pydantic.BaseModel):
    """Book a table."""

    __tool_name__ = "book_table"
    title: str
    people: int
    address: Address


def test_pydantic_tool_and_pydantic_parameter():
    spec = to_tool_spec(Booking)
    assert spec.name == "book_table" and spec.description == "Book a table."
    params = spec.parameters
    assert params["properties"]["title"] == {"type": "string"}  # a property named title kept
    assert params["properties"]["address"] == {"$ref": "#/$defs/Address"}
    assert params["$defs"]["Address"]["properties"]["city"] == {"type": "string"}

    def book(booking: Booking) -> str:
        return booking.address.city

    fn = to_tool_spec(book)
    assert fn.parameters["properties"]["booking"]["properties"]["people"] == {"type": "integer"}
    assert "Address" in fn.parameters["$defs"]
    args = {"booking": {"title": "x", "people": 2, "address": {"city": "Oslo", "zip_code": "1"}}}
    assert fn.call(args) == "Oslo"


def test_dict_and_openai_forms():
    tool = toy_tools()["set_alarm"]
    assert to_tool_spec(tool).schema() == tool
    assert to_tool_spec({"type": "function", "function": tool}).schema() == tool


class Opaque:
    pass


def no_hint(x) -> None: ...


def variadic(*args: int) -> None: ...


def bad_type(x: Opaque) -> None: ...


@pytest.mark.parametrize("bad, message", [
    (no_hint, "no type hint"),
    (variadic, "args"),
    (bad_type, "unsupported type"),
    ({"name": "x", "parameters": {"type": "object", "properties": {"a": {"default": {1, 2}}}}},
     "JSON-serialisable"),
    ({"name": "has space", "parameters": {}}, "tool name"),
    ({"name": "x", "parameters": {"type": "array"}}, "type object"),
    (42, "cannot make a tool"),
])
def test_bad_tools_raise_tool_schema_error(bad, message):
    with pytest.raises(ToolSchemaError, match=message):
        to_tool_spec(bad)


def test_duplicate_names_raise_at_construction(toy):
    tool = toy_tools()["set_alarm"]
    with pytest.raises(ToolSchemaError, match="duplicate"):
        tool_specs([tool, dict(tool)])
    with pytest.raises(ToolSchemaError):
        Needle(tools=[tool, tool], model=toy)


def test_unsupported_schema_raises_at_construction(toy):
    bad = {"name": "x", "description": "", "parameters": {
        "type": "object", "properties": {"a": {"type": "strnig"}}}}
    with pytest.raises(ToolSchemaError):
        Needle(tools=[bad], model=toy)


def test_parse_docstring_sections():
    description, params = parse_docstring("Do it.\n\nArgs:\n    a: first\n    b (int): second\n"
                                          "        more\n\nRaises:\n    ValueError: never\n")
    assert description == "Do it."
    assert params == {"a": "first", "b": "second more"}

