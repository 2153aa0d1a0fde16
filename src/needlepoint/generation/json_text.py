"""Scanning JSON text one character at a time, as a model writes it: the string rule every
incremental scanner of call text shares (`decisions.CallCursor`, the server's
`streaming.JsonSpacer` and `streaming.CallSplitter`)."""

from __future__ import annotations


def string_step(ch: str, escaped: bool) -> tuple[bool, bool]:
    """(still inside the string, the next character is escaped) after `ch`, a character
    inside a JSON string; `escaped`: `ch` follows an unescaped backslash."""
    if escaped:
        return True, False
    if ch == "\\":
        return True, True
    return ch != '"', False
