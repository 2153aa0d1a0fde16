"""Tool-call syntaxes of chat templates: which one a model's template uses, and FunctionGemma's
call text read back as JSON (issue 28 item 4).

A template model writes its calls in its own syntax, the one its chat template renders past
calls in (so the prompt and the answer agree):

* `hermes`: the template renders no tools; needlepoint's Hermes-style tool prompt goes in the
  system turn and calls come as one JSON list, `<tool_call>[{"name": ..., "arguments": ...}]
  </tool_call>` (`chat_format.HERMES_SYSTEM`; SmolLM2).
* `qwen`: the template renders tools and each call as its own `<tool_call>` block holding one
  JSON object (Qwen2.5, Qwen3 and their fine-tunes, Hermes 2 Pro): several blocks are parallel
  calls. The block's exact layout (Qwen's `<tool_call>\\n{...}\\n</tool_call>`, the text
  between blocks) is read off the template by rendering a probe call (`JsonBlocks.probe`).
* `functiongemma`: `<start_function_call>call:NAME{key:<escape>text<escape>,n:3}
  <end_function_call>` per call (FunctionGemma, a Gemma 3): strings inside `<escape>` markers,
  numbers, booleans and `null` bare, objects `{k:v}` and lists `[a,b]` with unquoted keys.

`detect` picks one from the template; `tool_format=` (`--tool-format`) names one instead. A
template that renders tools in a syntax none of these is, is a `ToolFormatError` as soon as
tools are offered (it can still chat without them).

Downstream everything is JSON: `FunctionGemmaToJson` turns FunctionGemma's call text into
`{"name": ..., "arguments": {...}}` as it streams, so the envelope, the OpenAI tool calls and
their streamed argument deltas are the same for every syntax.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ToolFormatError

TOOL_FORMATS = ("auto", "hermes", "qwen", "functiongemma")
FG_OPEN, FG_CLOSE, FG_ESCAPE = "<start_function_call>", "<end_function_call>", "<escape>"
QWEN_OPEN, QWEN_CLOSE = "<tool_call>", "</tool_call>"
PROBE = ("zq_probe_a", "zq_probe_b")


@dataclass(frozen=True)
class JsonBlocks:
    """One JSON call object per marker pair: `open + prefix + JSON + suffix + close`, blocks
    joined by `separator` (read off the template, `probe`)."""

    prefix: str = ""
    suffix: str = ""
    separator: str = "\n"

    @classmethod
    def probe(cls, render: Callable[[list[dict]], str]) -> JsonBlocks | None:
        """The layout of the template's calls: render an assistant turn with two probe calls
        and read what surrounds each JSON object; None when the template renders no
        `<tool_call>` blocks."""
        calls = [{"type": "function", "function": {"name": n, "arguments": {"zq": 1}}}
                 for n in PROBE]
        try:
            text = render([{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "", "tool_calls": calls}])
        except Exception:  # noqa: BLE001 - a template that cannot render calls: no layout
            return None
        first, second = text.find(QWEN_OPEN), text.rfind(QWEN_OPEN)
        if first < 0 or first == second:
            return None
        block = text[first + len(QWEN_OPEN) : text.find(QWEN_CLOSE, first)]
        start, end = block.find("{"), block.rfind("}")
        if start < 0 or PROBE[0] not in block:
            return None
        between = text[text.find(QWEN_CLOSE, first) + len(QWEN_CLOSE) : second]
        return cls(block[:start], block[end + 1 :], between)


def detect(template: str, renders_tools: bool, blocks: JsonBlocks | None) -> str | None:
    """The call syntax of a chat template: `hermes` when it renders no tools at all
    (needlepoint's prompt), `functiongemma` when it writes FunctionGemma's call marker, `qwen`
    when it renders calls as `<tool_call>` JSON blocks, None when it renders tools some other
    way."""
    if not renders_tools:
        return "hermes"
    if FG_OPEN in template:
        return "functiongemma"
    if blocks is not None:
        return "qwen"
    return None


def check_tool_format(name: str | None) -> str:
    """A `tool_format` option's value ("auto" for None); ToolFormatError when unknown."""
    name = "auto" if name is None else name
    if name not in TOOL_FORMATS:
        raise ToolFormatError(f"tool_format {name!r} is not known (known: "
                              f"{', '.join(TOOL_FORMATS)})")
    return name


def parse_template_kwargs(text: str) -> dict:
    """`--chat-template-kwargs` of run / chat / serve: a JSON object of chat-template
    variables (`{"enable_thinking": false}`, as llama.cpp's server takes it); ValueError with
    the reason otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object of template variables, got {text!r}")
    return value


# ---------------------------------------------------------------------- FunctionGemma -> JSON
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
                    keep = _held(text[i:], FG_ESCAPE)
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


def _held(text: str, marker: str) -> int:
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def functiongemma_calls(text: str) -> list[dict]:
    """The calls of an answer in FunctionGemma's syntax (`<start_function_call>call:NAME{...}
    <end_function_call>` blocks), as OpenAI-style `{"name", "arguments"}`; ValueError when a
    block is not that syntax."""
    calls = []
    rest = text
    while FG_OPEN in rest:
        start = rest.index(FG_OPEN) + len(FG_OPEN)
        end = rest.find(FG_CLOSE, start)
        if end < 0:
            raise ValueError("a FunctionGemma call has no <end_function_call>")
        translator = FunctionGemmaToJson()
        body = translator.feed(rest[start:end]) + translator.finish()
        value = json.loads(body)
        if not isinstance(value, dict) or not isinstance(value.get("arguments"), dict):
            raise ValueError(f"not a FunctionGemma call: {rest[start:end]!r}")
        calls.append(value)
        rest = rest[end + len(FG_CLOSE) :]
    return calls
