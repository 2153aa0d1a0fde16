"""Tool-call syntaxes of chat-template models: one class per syntax behind `CallSyntax`.

A template model writes its calls in its own syntax, the one its chat template renders past
calls in (so the prompt and the answer agree). Each syntax is one class (`syntax_hermes.py`,
`syntax_qwen.py`, `syntax_functiongemma.py`) that says, for one chat format
(`formats/chat_format.TemplateFormat`):

* whether the template is written in it (`detects`), and whether the format can speak it at
  all (`for_format` raises `ToolFormatError` otherwise: a marker token missing, no tools in the
  template);
* its call markers (`open`, `close`), what is between them (`body`: one JSON list of calls,
  or one call per marker pair) and what closes a call in its layout (`closing`);
* the grammar of the calls between the markers (`calls_lark`, the `calls_list` rule of the
  whole-answer grammar, `answer_grammar.AnswerGrammar`);
* how its call text reads back as JSON: whole (`parse`) and streamed (`translator`: None when
  the text is JSON already; the streaming splitter is `text_markers.TextMarkerParser`).

`syntaxes.py` holds the registry and chooses a format's syntax once (`syntax_for`). Adding a
syntax is one file with one class, plus its line in `syntaxes.SYNTAXES` (or `register`).
Downstream everything is JSON, so the envelope, the OpenAI tool calls and their streamed
argument deltas are the same for every syntax.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from ..errors import ToolFormatError
from ..formats.chat_format import HERMES, TemplateFormat
from .grammar import ToolCallGrammar

PROBE = ("zq_probe_a", "zq_probe_b")


class CallTranslator(Protocol):
    """Streams one call body in a syntax's own text as its JSON call object."""

    def feed(self, text: str) -> str: ...  # the JSON text now certain
    def finish(self) -> str: ...  # the rest


class CallSyntax(Protocol):
    """One tool-call syntax, as it applies to one chat format (see the module doc)."""

    name: ClassVar[str]  # the `tool_format` that names it
    title: ClassVar[str]  # how an error message names it
    open: str
    close: str
    body: str  # "list": one JSON list per marker pair; "object": one call per marker pair
    needs_tools: bool  # its call grammar has no alternative without a tool
    string_marker: str | None  # an added token that delimits strings in a call (read as text)

    @classmethod
    def detects(cls, fmt: TemplateFormat) -> bool: ...

    @classmethod
    def for_format(cls, fmt: TemplateFormat) -> CallSyntax: ...

    def check_tools(self, tools: Sequence[Mapping[str, Any]]) -> None: ...

    def calls_lark(self, parts: list[tuple[str, dict]], require: bool, parallel: bool,
                   json_style: str) -> str: ...

    def closing(self) -> str: ...

    def translator(self) -> Callable[[], CallTranslator] | None: ...

    def parse(self, text: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class JsonBlocks:
    """One JSON call object per marker pair: `open + prefix + JSON + suffix + close`, blocks
    joined by `separator` (read off the template, `probe`)."""

    prefix: str = ""
    suffix: str = ""
    separator: str = "\n"

    @classmethod
    def probe(cls, fmt: TemplateFormat, open_: str = "<tool_call>",
              close: str = "</tool_call>") -> JsonBlocks | None:
        """The layout of the template's calls: render an assistant turn with two probe calls
        and read what surrounds each JSON object; None when the template renders no
        tools, or no `open ... close` blocks."""
        if not fmt.renders_tools:
            return None
        calls = [{"type": "function", "function": {"name": n, "arguments": {"zq": 1}}}
                 for n in PROBE]
        try:
            text = fmt.render([{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "", "tool_calls": calls}],
                              None, False)
        except Exception:  # noqa: BLE001 - a template that cannot render calls: no layout
            return None
        first, second = text.find(open_), text.rfind(open_)
        if first < 0 or first == second:
            return None
        block = text[first + len(open_) : text.find(close, first)]
        start, end = block.find("{"), block.rfind("}")
        if start < 0 or PROBE[0] not in block:
            return None
        between = text[text.find(close, first) + len(close) : second]
        return cls(block[:start], block[end + 1 :], between)


def spaced(lark: str) -> str:
    """A call grammar's JSON with `", "` and `": "` separators (`json.dumps`' default, the
    style chat templates render calls in and the Hermes-style prompt shows) instead of the
    compact style of Needle's wire format."""
    return (lark.replace('{\\"name\\":', '{\\"name\\": ')
            .replace(',\\"arguments\\":', ', \\"arguments\\": ')
            .replace('("," call)*', '(", " call)*')
            .replace('"item_separator": ","', '"item_separator": ", "')
            .replace('"key_separator": ":"', '"key_separator": ": "'))


class JsonSyntax:
    """The shared part of the syntaxes whose calls are JSON `{"name", "arguments"}` objects
    between text markers: `body="list"` (one JSON list of calls) or `"object"` (one call per
    marker pair, laid out as `layout` says). A subclass names itself, its markers and how it
    is detected."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    open = "<tool_call>"
    close = "</tool_call>"
    body = "object"
    needs_tools = False
    string_marker: str | None = None

    def __init__(self, layout: JsonBlocks | None = None) -> None:
        self.layout = layout or JsonBlocks()

    @classmethod
    def detects(cls, fmt: TemplateFormat) -> bool:
        return False

    @classmethod
    def for_format(cls, fmt: TemplateFormat) -> JsonSyntax:
        return cls(JsonBlocks.probe(fmt, cls.open, cls.close))

    def check_tools(self, tools: Sequence[Mapping[str, Any]]) -> None:
        """Nothing to refuse: any tool can be called in JSON."""

    def calls_lark(self, parts: list[tuple[str, dict]], require: bool, parallel: bool,
                   json_style: str = "spaced") -> str:
        """`calls_list`: the calls between the markers. List body: `[call, call, ...]`;
        object body: `call</tool_call>\\n<tool_call>call...`. Unlike Needle's grammar a tool
        may be called more than once (OpenAI parallel calls: the same function for two
        cities); one call only without `parallel`; `[]` only when a call is not required
        (list body)."""
        per_tool = ToolCallGrammar.call_rules(parts)
        choice = "call: " + " | ".join(f"call{i}" for i in range(len(parts)))
        if self.body == "object":
            quoted = [json.dumps(t) if t else "" for t in (self.layout.prefix,
                                                            self.layout.suffix)]
            block = " ".join(p for p in (quoted[0], "call", quoted[1]) if p)
            between = json.dumps(f"{self.close}{self.layout.separator}{self.open}")
            head = f"calls_list: {block}" + (f" ({between} {block})*" if parallel else "")
        else:
            some = 'call ("," call)*' if parallel else "call"
            head = f'calls_list: "[" {some} "]"' + ("" if require else ' | "[]"')
        lark = "\n".join([head, choice, *per_tool]) + "\n"
        return spaced(lark) if json_style == "spaced" else lark

    def closing(self) -> str:
        """What closes a call: the block's suffix, then the closing marker."""
        return self.layout.suffix + self.close

    def translator(self) -> Callable[[], CallTranslator] | None:
        return None  # the call text is JSON already

    def parse(self, text: str) -> list[dict[str, Any]]:
        """The calls of a whole answer; ValueError when a block is not JSON calls."""
        calls: list[dict[str, Any]] = []
        for body in marked_blocks(text, self.open, self.close):
            value = json.loads(body)
            for call in value if self.body == "list" and isinstance(value, list) else [value]:
                if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
                    raise ValueError(f"not a call: {body!r}")
                calls.append(call)
        return calls


def require_template_tools(name: str, fmt: TemplateFormat) -> None:
    """ToolFormatError unless the template renders tools (a syntax it writes itself)."""
    if not fmt.renders_tools:
        raise ToolFormatError(f"tool_format {name!r}: the chat template renders no tools (use "
                              f"{HERMES!r}, needlepoint's own tool prompt)")


def marked_blocks(text: str, open_: str, close: str) -> list[str]:
    """The texts between each `open_ ... close` pair of `text`; ValueError when a block is
    not closed."""
    blocks = []
    rest = text
    while open_ in rest:
        start = rest.index(open_) + len(open_)
        end = rest.find(close, start)
        if end < 0:
            raise ValueError(f"a call has no {close}")
        blocks.append(rest[start:end])
        rest = rest[end + len(close) :]
    return blocks
