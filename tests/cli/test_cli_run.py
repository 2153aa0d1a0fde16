"""The run / chat / eval / download subcommands, through the real dispatcher."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

from conftest import REPO_ROOT, toy_model_path

import needlepoint
from needlepoint.api.needle import Needle
from needlepoint.cli.main import main

TOOLS = REPO_ROOT / "examples" / "tools.json"
EVAL = toy_model_path().parent / "needle3-toy.eval.jsonl"


def test_example_tools_are_the_toy_models_schemas():
    shipped = json.loads(TOOLS.read_text())
    known = {}
    for line in EVAL.read_text().splitlines():
        for tool in json.loads(line)["tools"]:
            known.setdefault(tool["name"], tool)
    assert shipped and all(tool == known[tool["name"]] for tool in shipped)


def test_run_json_answers_the_readme_query(capsys):
    assert main(["run", "wake me up at 06:45", "--tools", str(TOOLS), "--json"]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["type"] == "call"
    assert envelope["function_calls"] == [{"name": "set_alarm", "arguments": {"time": "06:45"}}]


def test_run_pretty_output(capsys):
    assert main(["run", "start a 10 minute timer", "--tools", str(TOOLS),
                 "--model", str(toy_model_path())]) == 0
    out = capsys.readouterr().out
    assert "call" in out and "set_timer" in out and '"minutes": 10' in out


def test_run_stream_json_events(capsys):
    assert main(["run", "start a 10 minute timer", "--tools", str(TOOLS), "--stream", "--json",
                 "--temperature", "0.7", "--seed", "4"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-1]["type"] == "done"
    deltas = "".join(e["text"] for e in lines[:-1] if e["type"] == "tool_call")
    envelope = lines[-1]["envelope"]
    assert envelope["seed"] == 4
    if envelope["type"] in ("call", "refuse"):
        assert json.loads(deltas) == envelope["function_calls"]


def test_run_bad_tools_file_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "tools.json"
    bad.write_text('[{"name": "a b"}]')
    assert main(["run", "hi", "--tools", str(bad)]) == 2
    assert "tool name" in capsys.readouterr().err


def test_chat_reads_piped_stdin(monkeypatch, capsys):
    stdin = io.StringIO("start a 10 minute timer\n\n/reset\nwake me up at 06:45\n/exit\nignored\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["chat", "--tools", str(TOOLS), "--json", "--max-new-tokens", "60"]) == 0
    captured = capsys.readouterr()
    envelopes = [json.loads(line) for line in captured.out.splitlines()]
    assert len(envelopes) == 2
    assert "(conversation reset)" in captured.err.splitlines()
    assert envelopes[1]["function_calls"] == [{"name": "set_alarm",
                                               "arguments": {"time": "06:45"}}]


def test_chat_multi_turn_in_a_subprocess():
    env = {**os.environ, "NEEDLEPOINT_MODEL": str(toy_model_path())}
    proc = subprocess.run(
        [sys.executable, "-m", "needlepoint", "chat", "--tools", str(TOOLS), "--json",
         "--max-new-tokens", "40"],
        input="start a 10 minute timer\nwhat is the weather in Paris\n", capture_output=True,
        text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    envelopes = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(envelopes) == 2
    assert envelopes[1]["timings"]["prefill_tokens"] < envelopes[0]["timings"]["prefill_tokens"]


def test_eval_json(capsys):
    """The scores count what they say: each mode's `correct` is the number of the 12 examples
    whose calls, decoded by the library on its own (`Needle.complete`, greedy, grammar on or
    off), equal the expected answers; the grammar never lets a call be malformed."""
    assert main(["eval", str(toy_model_path()), str(EVAL), "--limit", "12", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert set(scores) == {"grammar", "free"}
    examples = [json.loads(line) for line in EVAL.read_text().splitlines()[:12]]
    model = needlepoint.load(toy_model_path())
    for mode, score in scores.items():
        right = malformed = 0
        by_calls: dict[str, list[int]] = {}
        for example in examples:
            envelope = Needle(tools=example["tools"], model=model, grammar=mode == "grammar",
                              reasoning_budget=None, max_new_tokens=80
                              ).complete(example["query"])
            # Without the grammar the library also checks calls against the schemas
            # ("invalid"); eval counts only unparsable call text as malformed.
            unparsed = "error" in envelope and envelope["type"] != "invalid"
            ok = not unparsed and envelope["function_calls"] == example["answers"]
            right += ok
            malformed += unparsed
            tally = by_calls.setdefault(str(len(example["answers"])), [0, 0])
            tally[0] += ok
            tally[1] += 1
        assert score["total"] == 12
        assert score["correct"] == right, mode
        assert score["malformed"] == malformed, mode
        assert {n: [v["correct"], v["total"]] for n, v in score["by_expected_calls"].items()} \
            == by_calls
    assert scores["grammar"]["malformed"] == 0


def test_eval_table(capsys):
    assert main(["eval", str(toy_model_path()), str(EVAL), "--limit", "3", "--grammar", "on",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "grammar on" in out and "grammar off" not in out


def test_download_fails_fast_and_cleanly_offline(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    # Offline mode, and an endpoint nothing listens on (no network, whatever the machine has).
    for extra in ({"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}):
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "needlepoint", "download", "--timeout", "3",
             "--dir", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=90, env={**env, **extra})
        assert proc.returncode == 2
        assert "could not download Cactus-Compute/needle3" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert time.monotonic() - start < 60


def test_eval_no_speculate_gives_the_same_scores(capsys, monkeypatch):
    """`eval --no-speculate` decodes one pass per token: every example's tokens, in both
    modes, are the same as with speculation, so the scores are too."""
    import needlepoint.api.evaluate as evaluate

    tokens: list[list[int]] = []
    real_envelope = evaluate.turn_envelope

    def recording(result, **kwargs):
        tokens.append(list(result.tokens))
        return real_envelope(result, **kwargs)

    monkeypatch.setattr(evaluate, "turn_envelope", recording)
    args = ["eval", str(toy_model_path()), str(EVAL), "--limit", "6", "--json",
            "--no-progress"]
    assert main(args) == 0
    with_speculation, with_tokens = json.loads(capsys.readouterr().out), list(tokens)
    tokens.clear()
    assert main([*args, "--no-speculate"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert len(with_tokens) == 12 and all(with_tokens)  # 6 examples x (grammar, free)
    assert tokens == with_tokens
    for mode in ("grammar", "free"):
        for key in ("correct", "total", "malformed", "by_expected_calls", "decode_tokens"):
            assert with_speculation[mode][key] == without[mode][key], (mode, key)
