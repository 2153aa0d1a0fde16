"""Shared pieces of the `needlepoint.Needle` API tests (`test_api_*.py`): the toy model's
held-out examples and the tools they declare."""

from __future__ import annotations

import json

from conftest import toy_model_path

EVAL = toy_model_path().parent / "needle3-toy.eval.jsonl"


def toy_tools() -> dict[str, dict]:
    tools = {}
    for line in EVAL.read_text().splitlines():
        for tool in json.loads(line)["tools"]:
            tools.setdefault(tool["name"], tool)
    return tools
