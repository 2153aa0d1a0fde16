"""The complete calls of a call list that did not close: an answer cut by `max_new_tokens`
(or the context) in the middle of a call, or ended because the model began repeating a call
("repeat", `generation/decisions.py`). No call the model finished is lost: every complete
`{"name": ..., "arguments": {...}}` object before the cut is kept, the unfinished one is
dropped, and a call identical to an earlier one is dropped (the repeat that ended the answer).
"""

from __future__ import annotations

import json
from typing import Any


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


__all__ = ["complete_calls"]
