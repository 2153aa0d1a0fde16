"""Shared pieces of the `needlepoint.Needle` API tests (`test_api_*.py`): the toy model's
held-out examples and the tools they declare."""

from __future__ import annotations

import json
from typing import Any

from conftest import get_fixture, toy_model_path

EVAL = toy_model_path().parent / "needle3-toy.eval.jsonl"


def toy_tools() -> dict[str, dict]:
    tools = {}
    for line in EVAL.read_text().splitlines():
        for tool in json.loads(line)["tools"]:
            tools.setdefault(tool["name"], tool)
    return tools


def tiny_weather_turn() -> tuple[Any, Any, dict]:
    """The tiny Needle 3 fixture (it has a confidence head) asked "weather in Lagos?" with one
    get_weather tool: (model, needle, envelope), for the confidence tests."""
    import needlepoint
    from needlepoint.api.needle import Needle

    model = needlepoint.load(get_fixture("needle3", "tiny").cact)
    tool = {"name": "get_weather", "description": "Get the weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}
    needle = Needle(tools=[tool], model=model, reasoning_budget=0, max_new_tokens=40)
    return model, needle, needle.complete("weather in Lagos?")
