"""The command line as a new user meets it: queries from stdin and files, tools files that
are not UTF-8, blank queries, no tools, bad options, corrupt weights and
`inspect --verify`, chat line editing / hints / bad lines / a full context, eval progress
in a log. Each was a traceback, a silent wrong answer or a dead end before."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, toy_model_path
from corrupt_helpers import corrupt_copy

from needlepoint.cli.main import main

TOOLS = REPO_ROOT / "examples" / "tools.json"
EVAL = toy_model_path().parent / "needle3-toy.eval.jsonl"
ALARM = [{"name": "set_alarm", "arguments": {"time": "06:45"}}]


def stdin_bytes(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


# ------------------------------------------------------------------ run: where the query is
def test_run_reads_the_query_from_stdin(monkeypatch, capsys):
    stdin_bytes(monkeypatch, b"wake me up at 06:45\n")
    assert main(["run", "-", "--tools", str(TOOLS), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["function_calls"] == ALARM


def test_run_reads_the_query_from_a_file(tmp_path, capsys):
    query = tmp_path / "query.txt"
    query.write_text("wake me up at 06:45\n", encoding="utf-8")
    for argv in (["--query-file", str(query)], [f"@{query}"]):
        assert main(["run", *argv, "--tools", str(TOOLS), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["function_calls"] == ALARM


def test_a_huge_query_from_stdin_is_a_clean_context_error(monkeypatch, capsys):
    stdin_bytes(monkeypatch, " ".join(["word"] * 200_000).encode())
    assert main(["run", "-", "--tools", str(TOOLS)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("needlepoint: error:") and "max_seq_len" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["run"], "no query"),
    (["run", ""], "empty"),
    (["run", "   "], "empty"),
    (["run", "hi", "--query-file", "q.txt"], "once"),
])
def test_run_query_mistakes_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.txt").write_text("hi")
    assert main([*argv, "--tools", str(TOOLS)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_non_utf8_inputs_are_clean_errors(tmp_path, capsys):
    tools = tmp_path / "tools.json"
    tools.write_bytes(json.dumps([{"name": "caf\u00e9"}]).encode("latin-1").replace(
        b"\\u00e9", b"\xe9"))
    assert main(["run", "hi", "--tools", str(tools)]) == 2
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "0xe9" in err and "Traceback" not in err
    query = tmp_path / "q.txt"
    query.write_bytes(b"r\xe9veille-moi")
    assert main(["run", "--query-file", str(query), "--tools", str(TOOLS)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_run_without_tools_says_so_at_once(capsys):
    assert main(["run", "send a message to Ana saying hi", "--json"]) == 0
    captured = capsys.readouterr()
    assert "no tools given" in captured.err
    envelope = json.loads(captured.out)
    assert envelope["type"] == "refuse" and envelope["timings"]["decode_tokens"] <= 5


@pytest.mark.parametrize(("argv", "name"), [(["--top-p", "5"], "top_p"),
                                            (["--max-new-tokens", "0"], "max_new_tokens"),
                                            (["--seed", str(2**63)], "seed")])
def test_bad_options_exit_2_naming_the_option(argv, name, capsys):
    assert main(["run", "hi", "--tools", str(TOOLS), *argv]) == 2
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


# ------------------------------------------------------------------ corrupt weights
def test_corrupt_weights_fail_loudly_and_verify_finds_them(tmp_path, capsys):
    bad = corrupt_copy(tmp_path, "layer01.w1b")
    assert main(["run", "wake me up at 06:45", "--tools", str(TOOLS), "--model", str(bad)]) == 2
    assert "non-finite" in capsys.readouterr().err  # it used to answer "" and exit 0
    assert main(["inspect", str(bad), "--verify"]) == 2
    err = capsys.readouterr().err
    assert "layer01.w1b" in err and "NaN or infinite" in err
    assert main(["inspect", str(bad), "--verify", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)["verify"]
    assert [b["name"] for b in report["bad"]] == ["layer01.w1b"]
    assert report["bad"][0]["non_finite"] == 16 and report["bad"][0]["first_row"] == 0
    cq = corrupt_copy(tmp_path, "layer00.q_proj", values=3)  # CQ norms, one row's groups
    assert main(["inspect", str(cq), "--verify", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)["verify"]
    assert [b["name"] for b in report["bad"]] == ["layer00.q_proj"]


def test_verify_passes_a_good_archive(capsys):
    assert main(["inspect", str(toy_model_path()), "--verify"]) == 0
    assert "all 125 tensors decode to finite values" in capsys.readouterr().out


# ------------------------------------------------------------------ chat
def test_chat_skips_a_non_utf8_line(monkeypatch, capsys):
    stdin_bytes(monkeypatch, b"wake me up at 06:45\nr\xe9veille\nwake me up at 06:45\n")
    assert main(["chat", "--tools", str(TOOLS), "--json", "--max-new-tokens", "40"]) == 0
    captured = capsys.readouterr()
    envelopes = [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]
    assert len(envelopes) == 2  # the session went on after the bad line
    assert "line 2 is not valid UTF-8" in captured.err


def test_chat_drops_old_turns_instead_of_exiting(monkeypatch, capsys):
    lines = "".join(f"start a {k + 2} minute timer\n" for k in range(12)).encode()
    stdin_bytes(monkeypatch, lines)
    assert main(["chat", "--tools", str(TOOLS), "--json", "--max-new-tokens", "40"]) == 0
    captured = capsys.readouterr()
    envelopes = [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]
    assert len(envelopes) == 12
    assert "context full: dropped the oldest" in captured.err
    assert any(e.get("dropped_turns") for e in envelopes)


def test_chat_at_a_terminal_edits_lines_and_names_the_commands():
    """On a pty (stdin and stdout terminals, as a user's shell has them): the hint names the
    commands, and readline line editing turns `0645`, two left arrows, `:` into `06:45`
    (the model used to receive the arrow keys as `^[[D`)."""
    env = {**os.environ, "NEEDLEPOINT_MODEL": str(toy_model_path()), "TERM": "xterm"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "needlepoint", "chat", "--tools", str(TOOLS), "--json",
         "--max-new-tokens", "40"],
        stdin=follower, stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    try:
        deadline = time.monotonic() + 60
        hint = b""
        while b"/reset" not in hint and time.monotonic() < deadline:  # the hint, on stderr
            if select.select([proc.stderr], [], [], 1)[0]:
                hint += os.read(proc.stderr.fileno(), 4096)
        assert b"/reset" in hint and b"/exit" in hint
        os.write(leader, b"wake me up at 0645\x1b[D\x1b[D:\r")
        out = b""
        while time.monotonic() < deadline:
            if not select.select([leader], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            out += chunk
            start = out.find(b'{"type"')
            if start >= 0 and b"\n" in out[start:]:  # the whole envelope line is in
                os.write(leader, b"/exit\r")
                break
        proc.wait(timeout=60)
    finally:
        proc.kill()
        os.close(leader)
    text = out.decode(errors="replace")
    envelopes = [json.loads(line[line.index('{"type"'):].strip()) for line in
                 text.splitlines() if '{"type"' in line]
    assert proc.returncode == 0
    assert envelopes and envelopes[0]["function_calls"] == ALARM, text


# ------------------------------------------------------------------ eval progress
def test_eval_prints_plain_progress_without_a_terminal(capsys):
    assert main(["eval", str(toy_model_path()), str(EVAL), "--limit", "3", "--grammar",
                 "on", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays pure JSON
    lines = [line for line in captured.err.splitlines() if line.startswith("eval: ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert "\x1b" not in captured.err  # no terminal control codes in a log
    assert main(["eval", str(toy_model_path()), str(EVAL), "--limit", "2", "--grammar", "on",
                 "--no-progress", "--json"]) == 0
    assert "eval: " not in capsys.readouterr().err
