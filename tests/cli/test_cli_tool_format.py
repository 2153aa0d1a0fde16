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


QUERY = "Wake me at 6:45 tomorrow, then call Ana."
FINITE = [*ALARM, {"name": "call_contact", "description": "Phone a contact.", "parameters": {
    "type": "object", "properties": {"contact": {"enum": ["Ana", "Bo"]}},
    "required": ["contact"]}}]  # finite values: random weights end every call


@pytest.mark.parametrize(("name", "kwargs"), [("qwen2-tiny", None),
                                              ("qwen3-tiny", {"enable_thinking": False}),
                                              ("gemma3-tiny", None)])
def test_run_and_chat_answer_a_call_in_the_family_format(name, kwargs, tmp_path, capsys,
                                                         monkeypatch) -> None:
    """Each family's own weights through `run` (plain and streamed) and a two-turn `chat`,
    with `--tool-choice required` and Qwen3's `--chat-template-kwargs`: the calls, the prompt
    and the streamed call text are `Needle`'s, in the family's syntax (FunctionGemma's call
    text streamed as its JSON)."""
    import io
    import sys

    import needlepoint

    path = str(hf_reference(name).folder)
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(FINITE))
    flags = ["--model", path, "--tools", str(tools), "--tool-choice", "required",
             "--max-new-tokens", "48", "--json",
             *(["--chat-template-kwargs", json.dumps(kwargs)] if kwargs else [])]
    needle = needlepoint.Needle(tools=FINITE, model=path, template_kwargs=kwargs,
                                max_new_tokens=48)
    expected = needle.complete(QUERY, require_call=True)
    assert expected["type"] == "call"
    assert main(["run", QUERY, *flags]) == 0
    envelope = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert envelope["type"] == "call"
    assert envelope["function_calls"] == expected["function_calls"]
    assert envelope["timings"]["prefill_tokens"] == len(needle.prompt_ids(QUERY))
    assert main(["run", QUERY, *flags, "--stream"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    streamed = "".join(line["text"] for line in lines if line["type"] == "tool_call")
    assert json.loads(streamed) == [{"name": c["name"], "arguments": c["arguments"]}
                                    for c in expected["function_calls"]]
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{QUERY}\nAnd Bo?\n"))
    assert main(["chat", *flags]) == 0
    turns = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    again = needlepoint.Needle(tools=FINITE, model=path, template_kwargs=kwargs,
                               max_new_tokens=48)
    chat = [again.chat(QUERY, require_call=True), again.chat("And Bo?", require_call=True)]
    assert [t["type"] for t in turns] == ["call", "call"]
    assert [t["function_calls"] for t in turns] == [t["function_calls"] for t in chat]
    assert not any(t.get("dropped_turns") for t in turns)


def test_chat_template_kwargs_and_tool_choice_flags(tools, capsys) -> None:
    """`--chat-template-kwargs` reaches the template (Qwen3's `enable_thinking` changes the
    prompt); a value that is not a JSON object is a usage error; `--tool-choice none` answers
    in text."""
    from needlepoint.formats.chat_format import TemplateFormat
    from needlepoint.formats.hf_checkpoint import open_hf_directory

    model = str(hf_reference("qwen3-tiny").folder)
    tokenizer = open_hf_directory(model).tokenizer
    seen = set()
    for kwargs in (None, {"enable_thinking": False}):
        flag = ["--chat-template-kwargs", json.dumps(kwargs)] if kwargs else []
        assert main(["run", "hi", "--model", model, "--tools", str(tools), "--json",
                     "--max-new-tokens", "2", "--tool-choice", "none", *flag]) == 0
        envelope = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert envelope["type"] == "respond" and not envelope["function_calls"]
        prompt = TemplateFormat(tokenizer, template_kwargs=kwargs).first_ids(ALARM, "hi")
        assert envelope["timings"]["prefill_tokens"] == len(prompt)
        seen.add(len(prompt))
    assert len(seen) == 2  # the closed think block of enable_thinking false
    for bad in ("[1]", "{oops"):
        with pytest.raises(SystemExit):
            main(["run", "hi", "--model", model, "--chat-template-kwargs", bad])
    assert "--chat-template-kwargs" in capsys.readouterr().err
