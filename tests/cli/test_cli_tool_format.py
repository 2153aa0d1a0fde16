"""`--tool-format` on `run` / `chat` (issue 28 item 4): a template model answers in the call
syntax the flag names (or its own, by default); a syntax its template cannot carry is one clean
error line, exit status 2. The model is llama-tiny (a chat template that renders tools as
`<tool_call>` JSON blocks)."""

from __future__ import annotations

import json

import pytest
from hf_helpers import hf_reference

from needlepoint.cli.main import main

ALARM = [{"name": "set_alarm", "description": "Set an alarm.", "parameters": {
    "type": "object", "properties": {"time": {"enum": ["06:45", "07:00"]}},
    "required": ["time"]}}]


@pytest.fixture()
def tools(tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(ALARM))
    return path


def _prompt_tokens(tools, capsys, *flag: str) -> int:
    model = str(hf_reference("llama-tiny").folder)
    assert main(["run", "wake me at 6:45", "--model", model, "--tools", str(tools), "--json",
                 "--max-new-tokens", "4", *flag]) == 0
    envelope = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return envelope["timings"]["prefill_tokens"]


def test_run_renders_the_prompt_of_the_named_syntax(tools, capsys) -> None:
    """The template's own syntax (qwen: tools rendered by the template) is the default; hermes
    puts needlepoint's Hermes-style tool prompt in the system turn instead."""
    from needlepoint.formats.chat_format import TemplateFormat
    from needlepoint.formats.hf_checkpoint import open_hf_directory

    tokenizer = open_hf_directory(hf_reference("llama-tiny").folder).tokenizer
    expected = {fmt: len(TemplateFormat(tokenizer, fmt).first_ids(ALARM, "wake me at 6:45"))
                for fmt in ("qwen", "hermes")}
    assert expected["qwen"] != expected["hermes"]
    assert _prompt_tokens(tools, capsys) == expected["qwen"]
    assert _prompt_tokens(tools, capsys, "--tool-format", "qwen") == expected["qwen"]
    assert _prompt_tokens(tools, capsys, "--tool-format", "hermes") == expected["hermes"]


def test_a_syntax_the_template_cannot_carry_is_one_error_line(tools, capsys) -> None:
    model = str(hf_reference("llama-tiny").folder)
    assert main(["run", "wake me", "--model", model, "--tools", str(tools),
                 "--tool-format", "functiongemma"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("needlepoint: error: ")
    assert "functiongemma" in lines[0] and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["run", "wake me", "--model", model, "--tool-format", "xml"])
