"""The `functiongemma` call syntax (FunctionGemma, a Gemma 3).

`<start_function_call>call:NAME{key:<escape>text<escape>,n:3}<end_function_call>` per call:
strings inside `<escape>` markers (the tokenizer's own added token), numbers, booleans and
`null` bare, objects `{k:v}` and lists `[a,b]` with unquoted keys; several calls follow one
another with nothing between the blocks. The grammar over the declared tools is
`functiongemma_grammar.py`; `FunctionGemmaToJson` turns the call text into
`{"name": ..., "arguments": {...}}` as it streams.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from ..errors import ToolFormatError
from ..formats.chat_format import TemplateFormat
from .call_syntax import CallTranslator, marked_blocks, require_template_tools
from .functiongemma_grammar import functiongemma_calls_lark
from .text_markers import held_prefix

FG_OPEN, FG_CLOSE, FG_ESCAPE = "<start_function_call>", "<end_function_call>", "<escape>"


class FunctionGemmaSyntax:
    name: ClassVar[str] = "functiongemma"
    title: ClassVar[str] = "FunctionGemma"
    open, close = FG_OPEN, FG_CLOSE
    body = "object"
    needs_tools = True  # a call names one of the tools: no empty alternative
    string_marker: str | None = FG_ESCAPE

    def __init__(self, escape_id: int) -> None:
        self.escape_id = escape_id

    @classmethod
    def detects(cls, fmt: TemplateFormat) -> bool:
        return not fmt.uses_tool_prompt and FG_OPEN in fmt.template

    @classmethod
    def for_format(cls, fmt: TemplateFormat) -> FunctionGemmaSyntax:
        require_template_tools(cls.name, fmt)
        if not all(m in fmt.markers for m in (FG_OPEN, FG_CLOSE, FG_ESCAPE)):
            raise ToolFormatError(f"tool_format {cls.name!r}: the tokenizer has no "
                                  f"{FG_OPEN} / {FG_CLOSE} / {FG_ESCAPE} tokens")
        return cls(fmt.markers[FG_ESCAPE])

    def check_tools(self, tools: Sequence[Mapping[str, Any]]) -> None:
        """Nothing to refuse: the grammar writes any schema's values."""

    def calls_lark(self, parts: list[tuple[str, dict]], require: bool, parallel: bool,
                   json_style: str = "spaced") -> str:
        return functiongemma_calls_lark(parts, self.escape_id, parallel, FG_CLOSE + FG_OPEN)

    def closing(self) -> str:
        return FG_CLOSE

    def translator(self) -> Callable[[], CallTranslator] | None:
        return FunctionGemmaToJson

    def parse(self, text: str) -> list[dict[str, Any]]:
        return functiongemma_calls(text)


_NAME, _KEY, _VALUE, _AFTER, _STRING, _LITERAL, _DONE, _RAW = range(8)


class FunctionGemmaToJson:
    """Streams one FunctionGemma call body (`call:NAME{...}`, between the call markers) as
    its JSON call object. `feed(text)` returns the JSON text that is now certain, `finish()`
    the rest. Text that is not FunctionGemma's syntax passes through unchanged (the envelope
    then reports the call as unparseable), so a free (unconstrained) answer never raises."""

    def __init__(self) -> None:
        self.state = _NAME
        self.buffer = ""  # the name, key or literal being read, or a held part of <escape>
        self.stack: list[str] = []  # "{" / "[" of the open argument values

    def feed(self, text: str) -> str:
        out: list[str] = []
        text = self.buffer + text
        self.buffer = ""
        i = 0
        while i < len(text):
            if self.state == _RAW:
                out.append(text[i:])
                break
            if self.state == _STRING:
                end = text.find(FG_ESCAPE, i)
                if end < 0:
                    keep = held_prefix(text[i:], FG_ESCAPE)
                    out.append(json.dumps(text[i : len(text) - keep])[1:-1])
                    self.buffer = text[len(text) - keep :]
                    break
                out.append(json.dumps(text[i:end])[1:-1] + '"')
                i, self.state = end + len(FG_ESCAPE), _AFTER
                continue
            if self.state == _VALUE and text.startswith(FG_ESCAPE[: len(text) - i], i) \
                    and len(text) - i < len(FG_ESCAPE):
                self.buffer = text[i:]  # maybe the start of <escape>
                break
            i = self._char(text, i, out)
        return "".join(out)

    def _char(self, text: str, i: int, out: list[str]) -> int:
        c = text[i]
        state = self.state
        if state == _NAME:
            if c != "{":
                self.buffer += c
                return i + 1
            name = self.buffer.removeprefix("call:")
            if not self.buffer.startswith("call:"):
                return self._raw(text, i, out, self.buffer)
            self.buffer = ""
            out.append(f'{{"name": {json.dumps(name)}, "arguments": {{')
            self.stack.append("{")
            self.state = _KEY
            return i + 1
        if state == _KEY:
            if c == "}" and not self.buffer:
                return self._close(c, i, out)
            if c != ":":
                self.buffer += c
                return i + 1
            out.append(json.dumps(self.buffer) + ": ")
            self.buffer, self.state = "", _VALUE
            return i + 1
        if state == _VALUE:
            if text.startswith(FG_ESCAPE, i):
                out.append('"')
                self.state = _STRING
                return i + len(FG_ESCAPE)
            if c in "{[":
                out.append(c)
                self.stack.append(c)
                self.state = _KEY if c == "{" else _VALUE
                return i + 1
            if c == "]" and self.stack and self.stack[-1] == "[":
                return self._close(c, i, out)
            self.state = _LITERAL
            return i
        if state == _LITERAL:
            if c not in ",}]":
                self.buffer += c
                return i + 1
            out.append(self.buffer)
            self.buffer, self.state = "", _AFTER
            return i
        if state == _AFTER:
            if c == ",":
                out.append(", ")
                self.state = _KEY if self.stack and self.stack[-1] == "{" else _VALUE
                return i + 1
            if c in "}]":
                return self._close(c, i, out)
        return self._raw(text, i, out, "")

    def _close(self, c: str, i: int, out: list[str]) -> int:
        self.stack.pop()
        out.append(c)
        self.state = _DONE if not self.stack else _AFTER
        if self.state == _DONE:
            out.append("}")
        return i + 1

    def _raw(self, text: str, i: int, out: list[str], pending: str) -> int:
        self.state = _RAW
        out.append(pending + text[i:])
        self.buffer = ""
        return len(text)

    def finish(self) -> str:
        rest, self.buffer = self.buffer, ""
        return rest


def functiongemma_calls(text: str) -> list[dict]:
    """The calls of an answer in FunctionGemma's syntax (`<start_function_call>call:NAME{...}
    <end_function_call>` blocks), as OpenAI-style `{"name", "arguments"}`; ValueError when a
    block is not that syntax."""
    calls = []
    for block in marked_blocks(text, FG_OPEN, FG_CLOSE):
        translator = FunctionGemmaToJson()
        value = json.loads(translator.feed(block) + translator.finish())
        if not isinstance(value, dict) or not isinstance(value.get("arguments"), dict):
            raise ValueError(f"not a FunctionGemma call: {block!r}")
        calls.append(value)
    return calls
