"""Adding a call syntax is one class: `ArrowSyntax` below exists only in this file, is registered
at run time, and a llama-tiny model whose chat template writes calls as
`<<call>>NAME {"arg": ...}<</call>>` then calls tools through `Needle` in that syntax (the
grammar is the class's, the call text is read back as JSON by its translator), streamed and
whole, with `tool_format=` naming it; unregistered, the same template's tools are refused."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import pytest
from hf_helpers import hf_fixture_dir

import needlepoint
from needlepoint.errors import ToolFormatError
from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.generation import syntaxes
from needlepoint.generation.call_syntax import CallSyntax, CallTranslator
from needlepoint.generation.events import ToolCallDelta

OPEN, CLOSE = "<<call>>", "<</call>>"
TOOLS = [
    {"name": "set_alarm", "description": "Set an alarm.", "parameters": {
        "type": "object", "properties": {"time": {"type": "string", "enum": ["06:45", "7"]},
                                         "loud": {"type": "boolean"}},
        "required": ["time", "loud"]}},
    {"name": "call_contact", "description": "Phone a contact.", "parameters": {
        "type": "object", "properties": {"contact": {"enum": ["Ana", "Bo"]}},
        "required": ["contact"]}},
]


class ArrowToJson:
    """`NAME {args}` streamed as `{"name": "NAME", "arguments": {args}}`."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.held = ""

    def feed(self, text: str) -> str:
        if self.name is not None:
            return text
        self.held += text
        if " " not in self.held:
            return ""
        self.name, rest = self.held.split(" ", 1)
        return f'{{"name": {json.dumps(self.name)}, "arguments": {rest}'

    def finish(self) -> str:
        return "}" if self.name is not None else self.held


class ArrowSyntax:
    name: ClassVar[str] = "arrow"
    title: ClassVar[str] = "the test's <<call>> syntax"
    open, close = OPEN, CLOSE
    body = "object"
    needs_tools = True
    string_marker = None

    @classmethod
    def detects(cls, fmt: TemplateFormat) -> bool:
        return not fmt.uses_tool_prompt and OPEN in fmt.template

    @classmethod
    def for_format(cls, fmt: TemplateFormat) -> ArrowSyntax:
        return cls()

    def check_tools(self, tools: Sequence[Mapping[str, Any]]) -> None:
        pass

    def calls_lark(self, parts: list[tuple[str, dict]], require: bool, parallel: bool,
                   json_style: str) -> str:
        calls = [f"call{i}: {json.dumps(name + ' ')} args{i}\nargs{i}: %json {json.dumps(schema)}"
                 for i, (name, schema) in enumerate(parts)]
        choice = "call: " + " | ".join(f"call{i}" for i in range(len(parts)))
        head = "calls_list: call" + (f" ({json.dumps(CLOSE + OPEN)} call)*" if parallel else "")
        return "\n".join([head, choice, *calls]) + "\n"

    def closing(self) -> str:
        return CLOSE

    def translator(self) -> Callable[[], CallTranslator] | None:
        return ArrowToJson

    def parse(self, text: str) -> list[dict[str, Any]]:
        out = []
        for block in text.split(OPEN)[1:]:
            translator = ArrowToJson()
            out.append(json.loads(translator.feed(block.split(CLOSE)[0]) + translator.finish()))
        return out


def test_the_class_satisfies_the_protocol() -> None:
    syntax: CallSyntax = ArrowSyntax()  # checked by mypy / pyright: the Protocol's members
    assert syntax.parse(f'{OPEN}f {{"a": 1}}{CLOSE}') == [{"name": "f", "arguments": {"a": 1}}]


@pytest.fixture(scope="module")
def arrow_model(tmp_path_factory):
    """llama-tiny with a chat template that renders calls in the arrow syntax."""
    folder = tmp_path_factory.mktemp("arrow")
    source = hf_fixture_dir("llama-tiny")
    for item in source.iterdir():
        shutil.copy(item, folder / item.name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    call = ("{{- '\\n<tool_call>{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}"
            "\n{%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}{%- else -%}"
            "{{- fn['arguments'] | tojson -}}{%- endif -%}\n{{- '}</tool_call>' -}}")
    assert call in template
    arrow = ("{{- '\\n" + OPEN + "' + fn['name'] + ' ' + (fn['arguments'] | tojson) + '"
             + CLOSE + "' -}}")
    config["chat_template"] = template.replace(call, arrow).replace("<tool_call>", OPEN) \
        .replace("</tool_call>", CLOSE)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return needlepoint.load(folder)


@pytest.fixture
def registered():
    syntaxes.register(ArrowSyntax)
    yield
    syntaxes.unregister(ArrowSyntax.name)


def test_unregistered_the_template_takes_no_tools(arrow_model) -> None:
    with pytest.raises(ToolFormatError, match="does not know"):
        needlepoint.Needle(tools=TOOLS, model=arrow_model, cache=None)
    assert "arrow" not in syntaxes.tool_formats()


def test_a_registered_syntax_calls_tools_through_needle(arrow_model, registered) -> None:
    assert syntaxes.tool_formats()[:2] == ("auto", "arrow")
    needle = needlepoint.Needle(tools=TOOLS, model=arrow_model, cache=None, max_new_tokens=48)
    assert isinstance(needle.planner.syntax, ArrowSyntax)
    events = list(needle.stream("Wake me at 6:45.", require_call=True))
    envelope = events[-1].envelope
    assert envelope["type"] == "call", envelope
    names = {t["name"] for t in TOOLS}
    for call in envelope["function_calls"]:
        assert call["name"] in names
        schema = next(t for t in TOOLS if t["name"] == call["name"])["parameters"]
        assert set(call["arguments"]) == set(schema["required"])
    streamed = "".join(e.text for e in events if isinstance(e, ToolCallDelta))
    assert json.loads(streamed) == envelope["function_calls"]
    named = needlepoint.Needle(tools=TOOLS, model=arrow_model, cache=None, tool_format="arrow")
    assert isinstance(named.planner.syntax, ArrowSyntax)
    # the answer goes back into the history in the template's (arrow) rendering
    text = needle.tokenizer.decode(needle.format.conversation_ids(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
                                             "tool_calls": envelope["function_calls"]},
         {"role": "user", "content": "again"}], TOOLS))
    first = envelope["function_calls"][0]
    assert f"{OPEN}{first['name']} {json.dumps(first['arguments'])}{CLOSE}" in text
