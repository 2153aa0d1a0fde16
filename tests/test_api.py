"""`needlepoint.Needle` on the bundled toy model, tool-schema extraction, model resolution."""

from __future__ import annotations

import enum
import json
import threading
from typing import Literal, Optional

import numpy as np
import pydantic
import pytest
from conftest import get_fixture, toy_model_path

import needlepoint
from needlepoint import ToolSchemaError
from needlepoint.api import ExtractionError, Needle
from needlepoint.events import Done, ToolCallDelta
from needlepoint.hub import (
    MODEL_ENV,
    ModelCache,
    ModelNotFoundError,
    bundled_model_path,
    resolve_model_path,
)
from needlepoint.tools import parse_docstring, to_tool_spec, tool_specs

EVAL = toy_model_path().parent / "needle3-toy.eval.jsonl"


def toy_tools() -> dict[str, dict]:
    tools = {}
    for line in EVAL.read_text().splitlines():
        for tool in json.loads(line)["tools"]:
            tools.setdefault(tool["name"], tool)
    return tools


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


def bad_union(x: int | str) -> None: ...


@pytest.mark.parametrize("bad, message", [
    (no_hint, "no type hint"),
    (variadic, "args"),
    (bad_type, "unsupported type"),
    (bad_union, "union"),
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


# ------------------------------------------------------------------ Needle on the toy model
def test_complete_on_bundled_toy_model(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)
    tools = toy_tools()
    needle = Needle(tools=[tools["get_weather"], tools["set_timer"]])  # the bundled model
    envelope = needle.complete("can you time 50 minutes for me")
    assert envelope["type"] == "call"
    assert envelope["function_calls"] == [{"name": "set_timer", "arguments": {"minutes": 50}}]
    assert envelope["confidence"] is None  # the toy archive has no confidence head
    assert envelope["reasoning"] == "" and envelope["text"] == ""
    timings = envelope["timings"]
    for key in ("prefill_tps", "decode_tps", "prefill_tokens", "decode_tokens", "total_s"):
        assert timings[key] > 0


def test_eval_examples_the_model_gets_right(toy):
    """The README's reference answers (upstream numerics): exact on these examples."""
    lines = [json.loads(line) for line in EVAL.read_text().splitlines()[:6]]
    right = 0
    for example in lines:
        envelope = Needle(tools=example["tools"], model=toy).complete(example["query"])
        right += envelope["function_calls"] == example["answers"]
    assert right >= 2


def test_stream_yields_deltas_then_done(toy):
    tools = toy_tools()
    needle = Needle(tools=[tools["set_timer"], tools["set_alarm"]], model=toy)
    events = list(needle.stream("can you time 50 minutes for me"))
    assert isinstance(events[-1], Done)
    deltas = [e.text for e in events if isinstance(e, ToolCallDelta)]
    assert len(deltas) > 3
    assert json.loads("".join(deltas)) == events[-1].envelope["function_calls"]


def test_sampling_with_seed_is_reproducible(toy):
    tools = list(toy_tools().values())[:4]
    a = Needle(tools=tools, model=toy, temperature=1.0, seed=3)
    b = Needle(tools=tools, model=toy, temperature=1.0, seed=3)
    query = "set an alarm for 7 and tell Ana hi"
    assert a.complete(query)["function_calls"] == b.complete(query)["function_calls"]
    outputs = {json.dumps(a.complete(query, seed=s)["function_calls"]) for s in range(6)}
    assert len(outputs) > 1


def test_instances_do_not_share_state(toy):
    tools = toy_tools()
    a = Needle(tools=[tools["set_timer"]], model=toy)
    b = Needle(tools=[tools["get_weather"]], model=toy)
    first = a.complete("can you time 50 minutes for me")
    b.complete("what is the weather in Paris")
    assert a._conversation is not b._conversation
    assert a._conversation.session is not b._conversation.session
    assert a.complete("can you time 50 minutes for me")["function_calls"] == \
        first["function_calls"]


def test_run_executes_and_feeds_results_back(toy):
    calls = []

    def set_timer(minutes: int, label: str = "") -> dict:
        """Start a countdown timer."""
        calls.append(minutes)
        return {"ok": True, "minutes": minutes}

    needle = Needle(tools=[set_timer], model=toy, max_rounds=3)
    assert needle.tools[0].schema() == {**toy_tools()["set_timer"]}  # same prompt as training
    envelope = needle.run("can you time 50 minutes for me")
    assert calls == [50]  # executed once, never repeated
    assert envelope["type"] == "call"
    assert envelope["results"] == [{"name": "set_timer", "arguments": {"minutes": 50},
                                    "result": {"ok": True, "minutes": 50}}]
    assert len(envelope["turns"]) >= 2
    conversation = needle._conversation
    text = needle.tokenizer.decode(conversation.ids)
    assert '<tool_result>[{"name":"set_timer","result":{"ok":true,"minutes":50}}]' \
           '</tool_result>' in text
    assert text.count("<tools>") == 1


def test_run_reports_tool_errors(toy):
    def set_timer(minutes: int, label: str = "") -> None:
        """Start a countdown timer."""
        raise RuntimeError("timer broken")

    envelope = Needle(tools=[set_timer], model=toy).run("can you time 50 minutes for me")
    assert envelope["results"][0]["error"] == "RuntimeError: timer broken"


def test_chat_continues_and_reset_forgets(toy):
    tools = toy_tools()
    needle = Needle(tools=[tools["set_timer"], tools["set_alarm"]], model=toy,
                    max_new_tokens=60)
    needle.chat("can you time 50 minutes for me")
    session = needle._conversation.session
    before = session.position
    needle.chat("and wake me at 06:45")
    assert needle._conversation.session is session and session.position > before
    needle.reset()
    needle.chat("can you time 50 minutes for me")
    assert needle._conversation.session is not session


def test_extract_dict_and_pydantic(toy):
    schema = {"type": "object", "properties": {"time": {"type": "string"}},
              "required": ["time"]}
    needle = Needle(model=toy, max_new_tokens=40)
    out = needle.extract("wake me up at 06:45", schema)
    assert isinstance(out, dict) and isinstance(out["time"], str)

    class Alarm(pydantic.BaseModel):
        time: str

    assert isinstance(needle.extract("wake me up at 06:45", Alarm), Alarm)


def test_extract_raises_when_declined():
    class Declining:
        """A model stand-in whose every logit prefers `[]`: the grammar allows a refusal."""

    from fake_model import ScriptedModel

    tokenizer = needlepoint.open_archive(toy_model_path()).tokenizer
    script = tokenizer.encode("<tool_call>[]</tool_call><|im_end|>")
    needle = Needle(model=ScriptedModel(tokenizer, script, strength=40))
    with pytest.raises(ExtractionError):
        needle.extract("nothing", {"type": "object", "properties": {"a": {"type": "string"}}})


def test_generation_options_are_validated(toy):
    with pytest.raises(ValueError):
        Needle(model=toy, temperature=-1)
    with pytest.raises(TypeError):
        Needle(model=toy).complete("hi", temprature=1)


def test_auto_date_adds_system_fact(toy):
    needle = Needle(model=toy, auto_date=True, system={"locale": "en-US"})
    assert needle.system_text().startswith("locale: en-US; date: 20")
    assert Needle(model=toy).system_text() == ""


# ------------------------------------------------------------------ confidence
def test_confidence_matches_the_head_on_a_fixture():
    """The tiny fixture has a confidence head: the envelope's confidence is min(sigmoid(head
    over the whole turn), lowest in-call token probability), and the head logit equals the
    model's full recomputation; with float numerics it matches upstream's reference."""
    fixture = get_fixture("needle3", "tiny")
    model = needlepoint.load(fixture.cact)
    tool = {"name": "get_weather", "description": "Get the weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}
    needle = Needle(tools=[tool], model=model, reasoning_budget=0, max_new_tokens=40)
    envelope = needle.complete("weather in Lagos?")
    conversation = needle._conversation
    head = model.confidence_logit(conversation.ids)
    assert head is not None
    assert conversation.confidence_logit()[0] == pytest.approx(head, abs=1e-4)
    assert envelope["confidence"] <= 1 / (1 + np.exp(-head)) + 1e-6
    assert 0 < envelope["confidence"] <= 1

    float_model = needlepoint.load(fixture.cact, numerics="float")
    names = list(fixture.arrays["prompt_names"])
    i = names.index("tool_query")
    ids = list(fixture.arrays[f"p{i}_tokens"]) + list(fixture.arrays[f"p{i}_greedy_float"])
    expected = float(fixture.arrays[f"p{i}_with_greedy_conf_logit_float"])
    assert float_model.confidence_logit(ids) == pytest.approx(expected, abs=2e-3)


# ------------------------------------------------------------------ model resolution
def test_model_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv(MODEL_ENV, raising=False)
    bundled = bundled_model_path()
    assert bundled.name == "needle3-toy.cact"
    assert bundled.read_bytes() == toy_model_path().read_bytes()
    assert resolve_model_path(None) == bundled
    tiny = get_fixture("needle3", "tiny").cact
    monkeypatch.setenv(MODEL_ENV, str(tiny))
    assert resolve_model_path(None) == tiny
    assert resolve_model_path(toy_model_path()) == toy_model_path()
    monkeypatch.setenv(MODEL_ENV, str(tmp_path / "missing.cact"))
    with pytest.raises(ModelNotFoundError, match=MODEL_ENV):
        resolve_model_path(None)
    with pytest.raises(ModelNotFoundError):
        Needle(model=tmp_path / "nope.cact")


def test_model_cache_loads_once_across_threads():
    loads = []

    def loader(path):
        loads.append(path)
        return object()

    cache = ModelCache(loader)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.load(toy_model_path())))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len({id(r) for r in results}) == 1


def test_needle2_model_through_the_same_api():
    model = needlepoint.load(get_fixture("needle2", "tiny").cact)
    # Bounded arguments: random weights would otherwise fill a string up to max_new_tokens.
    door = {"name": "lock_door", "description": "Lock a door.", "parameters": {
        "type": "object", "properties": {"door": {"type": "string", "enum": ["front", "back"]},
                                         "note": {"type": "string", "maxLength": 2}}}}
    for seed in range(3):
        needle = Needle(tools=[door], model=model, temperature=1.0, seed=seed,
                        reasoning_budget=0, max_new_tokens=60)
        envelope = needle.complete("lock the front door")
        assert envelope["type"] in ("call", "refuse") and envelope["stop_reason"] == "end"
        for call in envelope["function_calls"]:
            assert call["name"] == "lock_door"
            assert call["arguments"].get("door", "front") in ("front", "back")
        assert envelope["confidence"] is not None  # the Needle 2 fixture has a head
