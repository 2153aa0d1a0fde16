"""The user-facing tool-call paths (CLI `run`, the HTTP server) on a Needle 2 archive.

The Needle 2 fixtures have random weights, so the answer itself is arbitrary; what these
tests pin is that the same commands and endpoints work unchanged on the second generation
and that whatever the model calls is a declared tool with schema-valid arguments (the
grammar holds on both generations).
"""

from __future__ import annotations

import copy
import json

import jsonschema
import openai
import pytest
from conftest import REPO_ROOT, get_fixture
from server_helpers import ServerThread

import needlepoint
from needlepoint.cli.main import main
from needlepoint.server import create_app

TOOLS = json.loads((REPO_ROOT / "examples" / "tools.json").read_text())
TOOLS_FILE = REPO_ROOT / "examples" / "tools.json"


def bounded(tools: list[dict]) -> list[dict]:
    """The example tools with short strings and small integers: random weights would
    otherwise fill a string until max_tokens, and a cut call is no call."""
    out = copy.deepcopy(tools)
    for tool in out:
        for prop in tool["parameters"]["properties"].values():
            if prop.get("type") == "string" and "enum" not in prop:
                prop["maxLength"] = 4
            if prop.get("type") == "integer":
                prop.update(minimum=0, maximum=99)
    return out


def check_calls(calls: list[dict], tools: list[dict]) -> None:
    schemas = {tool["name"]: tool["parameters"] for tool in tools}
    names = [call["name"] for call in calls]
    assert len(names) == len(set(names))
    for call in calls:
        jsonschema.validate(call["arguments"], schemas[call["name"]])


def test_cli_run_on_needle2(capsys, tmp_path):
    """`needlepoint run` on a Needle 2 archive answers exactly what the library answers for
    the same request; forced to call at once (`--reasoning-budget 0`), the answer is a
    grammar-valid call list."""
    archive = get_fixture("needle2", "small").cact
    model = needlepoint.load(archive)
    for query in ("wake me up at 06:45", "start a 10 minute timer"):
        for budget, tools in ((256, TOOLS), (0, bounded(TOOLS))):
            tools_file = tmp_path / "tools.json"
            tools_file.write_text(json.dumps(tools))
            code = main(["run", query, "--tools", str(tools_file), "--model", str(archive),
                         "--json", "--max-new-tokens", "48", "--reasoning-budget", str(budget)])
            assert code == 0
            envelope = json.loads(capsys.readouterr().out)
            alone = needlepoint.Needle(tools=tools, model=model, reasoning_budget=budget
                                       ).complete(query, max_new_tokens=48)
            for key in ("type", "function_calls", "text", "reasoning", "stop_reason"):
                assert envelope[key] == alone[key], key
            assert envelope["timings"]["prefill_tokens"] > 0
            assert isinstance(envelope["confidence"], float)  # Needle 2 archives have the head
            assert 0.0 <= envelope["confidence"] <= 1.0
            if budget == 0:
                assert envelope["type"] in ("call", "refuse") and envelope["stop_reason"] == "end"
                check_calls(envelope["function_calls"], tools)


def test_server_on_needle2():
    """The server on a Needle 2 archive: a forced call (`tool_choice: required`, no free
    tokens: `reasoning_effort: none`) is one grammar-valid call, the same as the library's."""
    archive = get_fixture("needle2", "small").cact
    model = needlepoint.load(archive)
    tools = bounded(TOOLS)
    app = create_app(model, workers=1, max_queue=4, max_body_bytes=256 * 1024)
    with ServerThread(app) as server:
        client = server.client()
        listed = [m.id for m in client.models.list().data]
        assert listed == ["small"]
        reply = client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "start a 10 minute timer"}],
            tools=[{"type": "function", "function": tool} for tool in tools],
            tool_choice="required", reasoning_effort="none", max_tokens=200, temperature=0)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                 for c in choice.message.tool_calls]
        assert calls
        check_calls(calls, tools)
        # and the library gives the same answer for the same greedy request
        alone = needlepoint.Needle(tools=tools, model=model, reasoning_budget=0).complete(
            "start a 10 minute timer", require_call=True, max_new_tokens=200)
        assert calls == alone["function_calls"]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "hi"}])
