"""The registry of tool-call syntaxes, and the one choice of a chat format's syntax.

`SYNTAXES` lists the syntax classes (`call_syntax.CallSyntax`) in detection order, most
specific first; `syntax_for(fmt)` picks a format's syntax once (memoised per format object):
the one its `tool_format` names, else the first that `detects` the template. A template that
renders tools in a syntax none of these is still chats, but offering it tools is a
`ToolFormatError` (`UnknownSyntax.check_tools`). Needle's wire format has no syntax object: its
call markers are single tokens, read by `segments.SegmentParser` (`syntax_for` gives None).

A new syntax: one module with one class, added here (or at run time, `register`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..errors import ToolFormatError
from ..formats.chat_format import NeedleFormat, TemplateFormat
from .call_syntax import CallSyntax
from .syntax_functiongemma import FunctionGemmaSyntax
from .syntax_hermes import HermesSyntax
from .syntax_qwen import QwenSyntax

SYNTAXES: list[type[CallSyntax]] = [HermesSyntax, FunctionGemmaSyntax, QwenSyntax]
_CHOSEN: weakref.WeakKeyDictionary[TemplateFormat, CallSyntax] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class UnknownSyntax(QwenSyntax):
    """A template that renders tools in no known syntax: it chats, it takes no tools."""

    name: ClassVar[str] = "unknown"

    def check_tools(self, tools: Sequence[Mapping[str, Any]]) -> None:
        if tools:
            raise ToolFormatError(
                "the chat template renders tools in a call syntax needlepoint does not know "
                f"(known: {', '.join(c.title for c in SYNTAXES)}); name one with tool_format= "
                f"/ --tool-format ({', '.join(c.name for c in SYNTAXES)})")


def register(syntax: type[CallSyntax]) -> None:
    """Add a syntax, tried before the others (`tool_format` names it by its `name`)."""
    with _LOCK:
        SYNTAXES[:] = [syntax, *[s for s in SYNTAXES if s.name != syntax.name]]
        _CHOSEN.clear()  # a format's choice may change


def unregister(name: str) -> None:
    """Remove the syntax called `name` (a test's own)."""
    with _LOCK:
        SYNTAXES[:] = [s for s in SYNTAXES if s.name != name]
        _CHOSEN.clear()


def tool_formats() -> tuple[str, ...]:
    """The values `tool_format` / `--tool-format` takes: "auto" and each syntax's name."""
    return ("auto", *(s.name for s in SYNTAXES))


def syntax_for(fmt: NeedleFormat | TemplateFormat) -> CallSyntax | None:
    """The call syntax of a chat format, chosen once (None for Needle's wire format);
    ToolFormatError when its `tool_format` is unknown or does not fit the template."""
    if not isinstance(fmt, TemplateFormat):
        return None
    with _LOCK:
        chosen = _CHOSEN.get(fmt)
        if chosen is None:
            chosen = _CHOSEN[fmt] = _choose(fmt)
        return chosen


def _choose(fmt: TemplateFormat) -> CallSyntax:
    detected = next((s for s in SYNTAXES if s.detects(fmt)), None)
    if fmt.tool_format == "auto":
        return (detected or UnknownSyntax).for_format(fmt)
    named = next((s for s in SYNTAXES if s.name == fmt.tool_format), None)
    if named is None:
        raise ToolFormatError(f"tool_format {fmt.tool_format!r} is not known (known: "
                              f"{', '.join(tool_formats())})")
    syntax = named.for_format(fmt)
    if detected is not None and detected is not named:
        raise ToolFormatError(f"tool_format {named.name!r}: the chat template writes "
                              f"{detected.title} calls")
    return syntax
