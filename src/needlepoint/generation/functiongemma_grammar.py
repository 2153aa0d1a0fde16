"""FunctionGemma's call syntax as a grammar over the declared tools.

A call is `call:NAME{key:value,...}` between `<start_function_call>` and `<end_function_call>`
(`syntax_functiongemma.py`); this module writes the `calls_list` rule of the whole-answer
grammar (`answer_grammar.AnswerGrammar`) from the tools' JSON schemas, in llguidance's lark:

* names: only the declared tools (`call:set_alarm`, ...);
* an object schema with `properties`: its keys in schema order, each optional key may be left
  out, every required key present, no other key (the closed schema of `tool_schema`);
* `string`: `<escape>` text `<escape>` (the `<escape>` marker is the tokenizer's own special
  token, so the text between cannot contain it; `enum` / `const` strings are literal);
  `integer` / `number`: JSON's number syntax, bare; `boolean`: `true` / `false`; `null`;
  `array`: `[a,b]` of its `items`; an object without properties: any `{key:value}` map; a list
  of types, `anyOf` / `oneOf`: any of them; no type: any value.

Several calls (parallel) follow one another with nothing between the blocks, as the template
renders them: `...}<end_function_call><start_function_call>call:...`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ToolSchemaError

INT = r"/-?(0|[1-9][0-9]*)/"
NUM = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"
KEY = r"/[A-Za-z_$][A-Za-z0-9_$.\-]*/"


class _Rules:
    """Lark rules written while walking the schemas (one name per sub-schema)."""

    def __init__(self, escape_id: int) -> None:
        self.esc = f"<[{escape_id}]>"
        self.lines: list[str] = [
            f"fg_str: {self.esc} FG_TEXT? {self.esc}",
            r"FG_TEXT: /(?s:.)+/ & ~/(?s:.*)<escape>(?s:.*)/",  # never the marker as text
            f"FG_INT: {INT}",
            f"FG_NUM: {NUM}",
            f"FG_KEY: {KEY}",
            'fg_any: fg_str | FG_NUM | "true" | "false" | "null" | fg_map | fg_list',
            'fg_map: "{" (FG_KEY ":" fg_any ("," FG_KEY ":" fg_any)*)? "}"',
            'fg_list: "[" (fg_any ("," fg_any)*)? "]"',
        ]
        self.count = 0

    def new(self, body: str) -> str:
        self.count += 1
        name = f"fg_r{self.count}"
        self.lines.append(f"{name}: {body}")
        return name

    def literal(self, value: Any) -> str:
        if isinstance(value, str):
            return f"{self.esc} {json.dumps(value)} {self.esc}" if value else \
                f"{self.esc} {self.esc}"
        if value is None:
            return '"null"'
        if isinstance(value, bool):
            return '"true"' if value else '"false"'
        if isinstance(value, (int, float)):
            return json.dumps(json.dumps(value))
        raise ToolSchemaError(f"enum value {value!r}: only strings, numbers, booleans and "
                              f"null can be FunctionGemma literals")

    def value(self, schema: Any) -> str:
        if not isinstance(schema, Mapping):
            return "fg_any"
        if "const" in schema:
            return self.new(self.literal(schema["const"]))
        if "enum" in schema:
            return self.new(" | ".join(self.literal(v) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), Sequence):
                return self.new(" | ".join(self.value(s) for s in schema[key]))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.new(" | ".join(self.value({**schema, "type": k}) for k in kind))
        if kind == "string":
            return "fg_str"
        if kind == "integer":
            return "FG_INT"
        if kind == "number":
            return "FG_NUM"
        if kind == "boolean":
            return self.new('"true" | "false"')
        if kind == "null":
            return self.new('"null"')
        if kind == "array":
            item = self.value(schema.get("items"))
            return self.new(f'"[" ({item} ("," {item})*)? "]"')
        if kind == "object" or "properties" in schema:
            return self.object(schema)
        return "fg_any"

    def object(self, schema: Mapping[str, Any]) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping) or not properties:
            return "fg_map"
        required = set(schema.get("required") or [])
        keys = list(properties)
        values = [self.value(properties[k]) for k in keys]
        # tail(k, first): the keys from k on, each optional one possibly left out; a tail that
        # may be empty (no required key left) is used as `tail?`
        can_end = [not any(key in required for key in keys[k:]) for k in range(len(keys) + 1)]
        tails: dict[tuple[int, bool], str] = {}
        for k in range(len(keys) - 1, -1, -1):
            for first in (True, False):
                options = []
                for j in range(k, len(keys)):
                    comma = "" if first else '"," '
                    rest = tails.get((j + 1, False), "")
                    rest += "?" if rest and can_end[j + 1] else ""
                    options.append(f'{comma}{json.dumps(keys[j] + ":")} {values[j]} {rest}'
                                   .strip())
                    if keys[j] in required:
                        break  # a required key cannot be skipped
                tails[(k, first)] = self.new(" | ".join(options))
        inner = tails[(0, True)] + ("?" if can_end[0] else "")
        return self.new(f'"{{" {inner} "}}"')


def functiongemma_calls_lark(parts: Sequence[tuple[str, Mapping[str, Any]]], escape_id: int,
                             parallel: bool, between: str) -> str:
    """The `calls_list` rule (and its sub-rules) for tools given as (name, parameters schema),
    `escape_id` the tokenizer's `<escape>` token, `between` the text between two calls (the
    closing marker, then the opening one)."""
    if not parts:
        raise ToolSchemaError("a FunctionGemma call grammar needs at least one tool")
    rules = _Rules(escape_id)
    calls = []
    for name, schema in parts:
        arguments = rules.object(schema) if isinstance(schema, Mapping) else "fg_map"
        calls.append(rules.new(f'{json.dumps("call:" + name)} {arguments}'))
    choice = rules.new(" | ".join(calls))
    head = f"calls_list: {choice}" + (f" ({json.dumps(between)} {choice})*" if parallel else "")
    return "\n".join([head, *rules.lines]) + "\n"
