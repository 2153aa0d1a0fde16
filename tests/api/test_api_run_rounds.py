"""`Needle.run`'s agent loop: one round of calls by default, `max_rounds` per call.

The issue this guards: "wake me up at 06:45" with set_alarm, get_weather and set_thermostat
executed set_alarm, then, on the model's reply to the tool result, get_weather and
set_thermostat: calls nobody asked for, with side effects."""

from __future__ import annotations

import pytest
from api_helpers import toy_tools
from conftest import toy_model_path

import needlepoint
from needlepoint.api.needle import Needle
from needlepoint.api.tools import ToolSpec
from needlepoint.errors import InvalidOptionError

QUERY = "wake me up at 06:45"
NAMES = ("set_alarm", "get_weather", "set_thermostat")


@pytest.fixture(scope="module")
def toy():
    return needlepoint.load(toy_model_path())


def recording_tools(ran: list[str]) -> list[ToolSpec]:
    """The toy model's own schemas for NAMES, each running a function that records its name."""
    def recorder(name: str):
        def run(**arguments):
            ran.append(name)
            return {"ok": True}
        return run

    schemas = toy_tools()
    return [ToolSpec(**schemas[name], function=recorder(name)) for name in NAMES]


def test_run_defaults_to_one_round(toy):
    ran: list[str] = []
    envelope = Needle(tools=recording_tools(ran), model=toy).run(QUERY)
    assert ran == ["set_alarm"]
    assert [r["name"] for r in envelope["results"]] == ["set_alarm"]
    assert envelope["function_calls"] == [{"name": "set_alarm",
                                           "arguments": {"time": "06:45"}}]
    # The model saw the result (one reply turn); what it asked for then was not executed.
    assert len(envelope["turns"]) == 2


def test_run_accepts_max_rounds_per_call(toy):
    ran: list[str] = []
    needle = Needle(tools=recording_tools(ran), model=toy)
    envelope = needle.run(QUERY, max_rounds=1)
    assert ran == ["set_alarm"] and len(envelope["turns"]) == 2
    # More rounds execute what the model asks for after seeing the result (the toy model
    # asks for more calls: exactly the behaviour the default now avoids).
    ran.clear()
    envelope = needle.run(QUERY, max_rounds=3)
    assert ran[0] == "set_alarm" and len(ran) > 1
    assert [r["name"] for r in envelope["results"]] == ran


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_rounds_must_be_a_positive_int(toy, bad):
    with pytest.raises(InvalidOptionError, match="max_rounds"):
        Needle(tools=recording_tools([]), model=toy, max_rounds=bad)
    with pytest.raises(InvalidOptionError, match="max_rounds"):
        Needle(tools=recording_tools([]), model=toy).run(QUERY, max_rounds=bad)
