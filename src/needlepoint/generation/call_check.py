"""Checking parsed tool calls against the declared tools, for turns decoded without the
grammar (`grammar=False`, `--no-grammar`): what the grammar would have enforced, as errors.

A call is invalid when it names an undeclared tool, repeats a tool already called in the
turn, or its arguments do not validate (JSON Schema Draft 2020-12, `jsonschema`) against the
tool's parameters closed the way the grammar closes them (no undeclared keys; `format` an
annotation). The call list is invalid when it is empty although a call was required, or has
several calls when only one was allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from .tool_schema import closed_schema


def call_errors(calls: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], *,
                require_call: bool = False, parallel_calls: bool = True) -> list[str]:
    """What is wrong with `calls` given `tools` (tool dicts with name/parameters); [] if
    nothing."""
    errors: list[str] = []
    if require_call and not calls:
        errors.append("a call was required, but the answer calls nothing")
    if not parallel_calls and len(calls) > 1:
        errors.append(f"{len(calls)} calls, but at most one was allowed")
    schemas = {tool["name"]: tool.get("parameters") or {"type": "object"} for tool in tools}
    seen: set[str] = set()
    for k, call in enumerate(calls):
        name = call["name"]
        if name not in schemas:
            declared = ", ".join(sorted(schemas)) or "none"
            errors.append(f"call {k}: {name!r} is not a declared tool (declared: {declared})")
            continue
        if name in seen:
            errors.append(f"call {k}: {name!r} is called twice in one turn")
        seen.add(name)
        schema = closed_schema(schemas[name], False, top=True)
        try:
            validator = jsonschema.Draft202012Validator(schema)
            problems = sorted(validator.iter_errors(call["arguments"]),
                              key=lambda e: [str(part) for part in e.path])
        except jsonschema.exceptions.SchemaError as error:
            errors.append(f"call {k} ({name}): the tool's schema is invalid: {error.message}")
            continue
        for problem in problems[:3]:
            where = "/".join(map(str, problem.path)) or "arguments"
            errors.append(f"call {k} ({name}): {where}: {problem.message}")
    return errors
