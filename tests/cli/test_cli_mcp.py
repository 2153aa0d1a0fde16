"""`needlepoint run --mcp` / `chat --mcp` (issue 29 item 1) with the shipped example server."""

from __future__ import annotations

import io
import json

from conftest import REPO_ROOT

from needlepoint.cli.main import main

EXAMPLE = REPO_ROOT / "examples" / "mcp.json"


def test_run_executes_the_calls_on_their_server(capsys):
    assert main(["run", "wake me up at 06:45", "--mcp", str(EXAMPLE), "--json"]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["results"] == [{"name": "set_alarm", "arguments": {"time": "06:45"},
                                    "server": "alarms",
                                    "result": {"status": "set", "time": "06:45", "label": ""}}]


def test_run_no_execute_only_prints_the_calls(capsys):
    assert main(["run", "wake me up at 06:45", "--mcp", str(EXAMPLE), "--no-execute",
                 "--json"]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["function_calls"] == [{"name": "set_alarm", "arguments": {"time": "06:45"}}]
    assert "results" not in envelope


def test_chat_feeds_mcp_results_back(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("wake me up at 06:45\n"))
    assert main(["chat", "--mcp", str(EXAMPLE), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["function_calls"] == [{"name": "set_alarm", "arguments": {"time": "06:45"}}]
    assert lines[1]["results"][0]["result"] == {"status": "set", "time": "06:45", "label": ""}
