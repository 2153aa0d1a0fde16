"""The user-facing tool-call paths (CLI `run`, the HTTP server) on a Needle 2 archive.

The Needle 2 fixtures have random weights, so the answer itself is arbitrary; what these
tests pin is that the same commands and endpoints work unchanged on the second generation
and that whatever the model calls is a declared tool with schema-valid arguments (the
grammar holds on both generations).
"""

from __future__ import annotations

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


def check_calls(calls: list[dict]) -> None:
    schemas = {tool["name"]: tool["parameters"] for tool in TOOLS}
    names = [call["name"] for call in calls]
    assert len(names) == len(set(names))
    for call in calls:
        jsonschema.validate(call["arguments"], schemas[call["name"]])


def test_cli_run_on_needle2(capsys):
    archive = get_fixture("needle2", "small").cact
    code = main(["run", "wake me up at 06:45", "--tools", str(TOOLS_FILE), "--model",
                 str(archive), "--json", "--max-new-tokens", "48"])
    assert code == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["type"] in ("call", "refuse", "respond")
    assert envelope["timings"]["prefill_tokens"] > 0
    assert isinstance(envelope["confidence"], float)  # Needle 2 archives carry the head
    check_calls(envelope["function_calls"])


def test_server_on_needle2():
    archive = get_fixture("needle2", "small").cact
    model = needlepoint.load(archive)
    app = create_app(model, workers=1, max_queue=4, max_body_bytes=256 * 1024)
    with ServerThread(app) as server:
        client = server.client()
        listed = [m.id for m in client.models.list().data]
        assert listed == ["small"]
        tools = [{"type": "function", "function": tool} for tool in TOOLS]
        reply = client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "start a 10 minute timer"}],
            tools=tools, tool_choice="required", max_tokens=48, temperature=0)
        choice = reply.choices[0]
        calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                 for c in choice.message.tool_calls or []]
        assert choice.finish_reason in ("tool_calls", "length", "stop")
        if choice.finish_reason == "tool_calls":
            assert calls
        check_calls(calls)
        # and the library gives the same answer for the same greedy request
        alone = needlepoint.Needle(tools=TOOLS, model=model).complete(
            "start a 10 minute timer", require_call=True, max_new_tokens=48)
        if choice.finish_reason == "tool_calls":
            assert calls == alone["function_calls"]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "hi"}])
