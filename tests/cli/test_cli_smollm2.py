"""`needlepoint run` and `chat` on SmolLM2 (a chat-template model, by its GGUF path): the
README's weather request answers with a tool call; chat continues the conversation."""

from __future__ import annotations

import io
import json

from conftest import REPO_ROOT
from hf_helpers import SmolLM2Reference

from needlepoint.cli.main import main

TOOLS = REPO_ROOT / "examples" / "tools.json"


def test_run_answers_a_tool_call(capsys) -> None:
    path = str(SmolLM2Reference().path)
    assert main(["run", "--model", path, "what is the weather in Paris", "--tools", str(TOOLS),
                 "--json", "--tool-choice", "required"]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["type"] == "call"
    assert envelope["function_calls"][0]["name"] == "get_weather"
    assert envelope["function_calls"][0]["arguments"]["city"] == "Paris"


def test_chat_continues_with_a_second_turn(monkeypatch, capsys) -> None:
    path = str(SmolLM2Reference().path)
    lines = b"what is the weather in Paris\nwhat is the weather in Rome\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(lines), encoding="utf-8"))
    assert main(["chat", "--model", path, "--tools", str(TOOLS), "--json",
                 "--max-new-tokens", "48", "--tool-choice", "required"]) == 0
    out = capsys.readouterr().out
    envelopes = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(envelopes) == 2 and envelopes[0]["type"] == "call"
    # the second turn prefilled only its own tail: the first turn's ids stayed cached
    assert envelopes[1]["timings"]["prefill_tokens"] < envelopes[0]["timings"]["prefill_tokens"]


def test_eval_scores_smollm2_with_its_grammar(tmp_path, capsys) -> None:
    """The same query twice: once with the answer the query states (Paris), once with a
    reference that names another city, which a correct scorer must count as a miss."""
    data = tmp_path / "weather.jsonl"
    tools = json.loads(TOOLS.read_text())
    rows = [{"query": "what is the weather in Paris", "tools": tools,
             "answers": [{"name": "get_weather", "arguments": {"city": city}}]}
            for city in ("Paris", "Rome")]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    path = str(SmolLM2Reference().path)
    assert main(["eval", path, str(data), "--grammar", "on", "--json", "--no-progress",
                 "--tool-choice", "required"]) == 0
    scores = json.loads(capsys.readouterr().out)["grammar"]
    assert (scores["correct"], scores["total"], scores["malformed"]) == (1, 2, 0), scores
    assert scores["accuracy"] == 0.5
    assert scores["by_expected_calls"] == {"1": {"correct": 1, "total": 2}}
