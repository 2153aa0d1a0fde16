"""Tool parameter schemas as the grammar (and the grammar-off validator) read them.

`closed_schema` makes every object that declares properties reject undeclared keys and drops
`format` unless formats are strict; `tool_parts` checks one tool dict and returns its name and
closed parameters schema with llguidance's JSON options attached.

`check_schema` refuses, before any grammar is compiled or token decoded, what the grammar
engine would only trip over later or crash on: nesting deeper than `MAX_DEPTH`, integers
outside 64 bits (llguidance cannot even serialise them), an invalid `pattern` regex (with
the engine's detail), and a `$ref`/`allOf`/`anyOf` loop that never reaches a value (llguidance
accepts it and fails when the model starts writing that value). Each error names the path.
`bounded_schema` gives integers and numbers without a bound the int64 range (`INT_BOUND`),
so a model cannot write digits until `max_tokens` (a tool schema, or `response_format`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import ToolSchemaError
from .schema_checks import SCHEMA_LISTS as _SCHEMA_LISTS
from .schema_checks import SCHEMA_MAPS as _SCHEMA_MAPS
from .schema_checks import SCHEMA_ONE as _SCHEMA_ONE
from .schema_checks import check_schema

__all__ = ["INT_BOUND", "bounded_schema", "check_schema", "closed_schema", "tool_parts"]

# The int64 range as llguidance can use it: it converts bounds to f64, and 2**63 - 1 rounds
# to 2**63, which overflows its integer regex builder; 2**63 - 1024 is the largest f64 below.
INT_BOUND = 2**63 - 1024

# No whitespace anywhere: the model was trained on compact JSON only.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":",
                 "coerce_one_of": True}  # oneOf as anyOf where llguidance cannot do better
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_COMPOSITION = ("anyOf", "oneOf", "allOf", "$ref")


def closed_schema(schema: Any, formats: bool, top: bool = False) -> Any:
    """Copy of `schema` where objects that declare properties (and the top level) reject
    undeclared keys: JSON schema allows extra keys by default, a tool call must not.
    An explicit additionalProperties/patternProperties/unevaluatedProperties is kept.
    Unless `formats`, `format` is dropped: JSON Schema 2020-12 makes it an annotation, and
    the training data uses it loosely ("format": "time" with answers like "06:45", which
    RFC 3339 full-time, what llguidance enforces, rejects)."""
    if not isinstance(schema, dict):
        return schema  # true/false schemas
    out = dict(schema)
    if not formats:
        out.pop("format", None)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_schema(sub, formats) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_schema(sub, formats) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            sub = out[key]
            out[key] = ([closed_schema(s, formats) for s in sub] if isinstance(sub, list)
                        else closed_schema(sub, formats))
    declares = "properties" in out or (top and not any(k in out for k in _COMPOSITION))
    if declares and not any(k in out for k in _OPEN_KEYS):
        out["additionalProperties"] = False
    return _bounded_node(out)


def _bounded_node(node: dict[str, Any]) -> dict[str, Any]:
    """`node` with the int64 range as the bounds it lacks, if it admits integers or numbers."""
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "integer" not in kinds and "number" not in kinds:
        return node
    if "maximum" not in node and "exclusiveMaximum" not in node:
        node["maximum"] = INT_BOUND
    if "minimum" not in node and "exclusiveMinimum" not in node:
        node["minimum"] = -INT_BOUND
    return node


def bounded_schema(schema: Any) -> Any:
    """Copy of `schema` where every integer or number schema without a maximum (minimum) gets
    `INT_BOUND` (`-INT_BOUND`): a value the model writes then has at most 19 integer digits."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: bounded_schema(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [bounded_schema(sub) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            sub = out[key]
            out[key] = ([bounded_schema(s) for s in sub] if isinstance(sub, list)
                        else bounded_schema(sub))
    return _bounded_node(out)


def tool_parts(tool: Any, index: int, formats: bool) -> tuple[str, dict]:
    """(name, closed parameters schema) of one tool dict; ToolSchemaError when malformed."""
    if not isinstance(tool, Mapping):
        raise ToolSchemaError(f"tool {index} is a {type(tool).__name__}, expected a dict with "
                              "'name' and 'parameters'")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(f"tool {index}: 'name' must be a non-empty string, got {name!r}")
    params = tool.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping):
        raise ToolSchemaError(f"tool {name!r}: 'parameters' must be a JSON schema object, got "
                              f"{type(params).__name__}")
    kind = params.get("type", "object")
    if kind != "object":
        raise ToolSchemaError(f"tool {name!r}: 'parameters' must be an object schema "
                              f"(type 'object'), got type {kind!r}")
    check_schema(params, f"tool {name!r}: parameters")
    try:  # round trip: proves it is plain JSON (no NaN, sets, objects) and copies it
        params = json.loads(json.dumps(params, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ToolSchemaError(f"tool {name!r}: 'parameters' is not JSON-serialisable: "
                              f"{exc}") from None
    closed = closed_schema(params, formats, top=True)
    closed["x-guidance"] = _JSON_OPTIONS
    return name, closed
