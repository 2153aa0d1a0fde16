"""Mistakes a new user makes on the command line (issue 22, item 4): each is one
`needlepoint: error:` line and exit status 2, not a traceback; and stdout of `chat --json`
stays JSON lines."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, toy_model_path

from needlepoint.cli.main import main

TOOLS = REPO_ROOT / "examples" / "tools.json"


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("needlepoint: error: ") and "Traceback" not in err
    return lines[0]


def test_eval_of_a_tools_file_is_a_clean_error(capsys):
    # examples/tools.json is one JSON list over many lines, not JSONL
    assert main(["eval", str(toy_model_path()), str(TOOLS), "--no-progress"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "tools.json:1" in line and "JSONL" in line


@pytest.mark.parametrize(("record", "words"), [
    ({"query": "hi"}, ["missing", "answers", "tools"]),
    ({"query": "hi", "tools": []}, ["missing", "answers"]),
    ([1, 2], ["expected", "object"]),
    ({"query": "hi", "tools": {}, "answers": []}, ["lists"]),
])
def test_eval_line_without_its_fields_is_a_clean_error(tmp_path, capsys, record, words):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(record) + "\n")
    assert main(["eval", str(toy_model_path()), str(data), "--no-progress"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "data.jsonl:1" in line and all(word in line for word in words)


def run_cli(*argv: str, env: dict[str, str] | None = None, stdin: str = "") -> \
        subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "needlepoint", *argv], input=stdin,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("argv", [
    ["run", "wake me up at 06:45", "--tools", str(TOOLS)],
    ["eval", str(toy_model_path()), str(toy_model_path().parent / "needle3-toy.eval.jsonl"),
     "--limit", "1"],
    ["serve", "--port", "8000"],
])
def test_bad_threads_variable_is_a_clean_error(argv):
    proc = run_cli(*argv, env={"NEEDLEPOINT_THREADS": "abc"})
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert "NEEDLEPOINT_THREADS" in line and "'abc'" in line


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_on_an_impossible_port_is_a_clean_error(port):
    proc = run_cli("serve", "--port", port)
    assert proc.returncode == 2
    assert "port" in one_error_line(proc.stderr) and "65535" in proc.stderr


def test_chat_json_stdout_is_only_json_lines(monkeypatch, capsys):
    stdin = io.StringIO("wake me up at 06:45\n/reset\nwake me up at 06:45\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["chat", "--tools", str(TOOLS), "--json", "--max-new-tokens", "40"]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]  # every line is JSON
    assert len(records) == 2
    assert "(conversation reset)" in captured.err


def test_an_over_long_query_says_what_to_do(tmp_path, capsys):
    query = tmp_path / "q.txt"
    query.write_text("word " * 3000)
    assert main(["run", "--query-file", str(query), "--tools", str(TOOLS)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "512" in line and "shorten the query" in line and "fewer tools" in line


def test_an_invalid_regex_in_a_tool_says_what_is_wrong(tmp_path, capsys):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "a(?=b)"}}}}]))
    assert main(["run", "hi", "--tools", str(tools)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "#/properties/a/pattern" in line and "look-around" in line


def test_stream_prints_whole_characters_of_byte_fallback_tokens(tmp_path, capsys):
    """Characters the tokenizer spells as byte pieces (`<0xE2><0x98><0x95>` for ☕) are held
    until complete: every streamed piece is whole text, none a U+FFFD."""
    value = "日本☕ café"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "enum": [value]}},
        "required": ["a"]}}], ensure_ascii=False), encoding="utf-8")
    assert main(["run", "say it", "--tools", str(tools), "--stream", "--json",
                 "--reasoning-budget", "0"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    pieces = [r["text"] for r in records[:-1]]
    assert not any("\ufffd" in piece for piece in pieces)
    assert any(piece in ("日", "本", "☕") for piece in pieces)  # one character, held whole
    assert json.loads("".join(pieces)) == [{"name": "f", "arguments": {"a": value}}]
    assert records[-1]["envelope"]["function_calls"] == [{"name": "f", "arguments": {"a": value}}]
