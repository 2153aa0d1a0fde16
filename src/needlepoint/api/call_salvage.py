"""Calls written outside the call markers, and the complete calls of a call list that did not
close.

`text_calls`: a text answer that is nothing but a JSON call (`{"name": ..., "arguments":
{...}}`, a list of them, or either in a fenced ```json block) naming declared tools with
arguments that fit their schemas is a call: what a model that does not use its template's
syntax writes (Qwen2.5-Coder-0.5B answers a weather question with a bare `{"name":
"get_weather", ...}`). A JSON object naming a tool not declared stays text (the same model
writes `{"name": "hello", ...}` to chit-chat).

`complete_calls`: the complete calls of a call list that did not close: an answer cut by
`max_new_tokens` (or the context) in the middle of a call, or ended because the model began
repeating a call ("repeat", `generation/decisions.py`). No call the model finished is lost:
every complete `{"name": ..., "arguments": {...}}` object before the cut is kept, the
unfinished one is dropped, and a call identical to an earlier one is dropped (the repeat that
ended the answer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..generation.call_check import call_errors

FENCED = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _call(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", {})
    return {"name": item["name"], "arguments": arguments} if isinstance(arguments, dict) \
        else None


def complete_calls(call_text: str) -> list[dict[str, Any]]:
    """The complete, well-formed calls at the start of a JSON call list `call_text` that may
    be cut anywhere, repeats of an earlier call left out."""
    decoder = json.JSONDecoder()
    text = call_text.lstrip()
    if not text.startswith("["):
        return []
    calls: list[dict[str, Any]] = []
    at = 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            break
        try:
            item, at = decoder.raw_decode(text, at)
        except ValueError:
            break  # the call being written when the answer was cut
        call = _call(item)
        if call is None:
            break
        if call not in calls:
            calls.append(call)
    return calls


def may_be_json_call(text: str) -> bool:
    """Whether an answer's text so far may still become one `text_calls` reads: it opens a
    JSON object or a fenced block, or could still become a fence (a stream holds it)."""
    head = text.lstrip()
    return not head or head.startswith(("{", "```")) or "```".startswith(head)


def text_calls(text: str, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The calls a text answer is, when it is only a JSON call (module doc), else []."""
    body = text.strip()
    fenced = FENCED.match(body)
    if fenced:
        body = fenced.group(1)
    if not body.startswith(("{", "[")):
        return []
    try:
        value = json.loads(body)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = [_call(item) for item in items]
    if not items or any(c is None for c in calls):
        return []
    names = {tool.get("name") for tool in tools}
    # each call on its own: one function may be called twice (two cities), not the same call
    if any(c["name"] not in names or call_errors([c], tools) for c in calls):  # type: ignore
        return []
    unique: list[dict[str, Any]] = []
    for call in calls:
        if call not in unique:
            unique.append(call)  # type: ignore[arg-type]
    return unique


__all__ = ["complete_calls", "may_be_json_call", "text_calls"]
