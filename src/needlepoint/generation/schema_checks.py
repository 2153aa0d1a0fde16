"""Checks of a JSON schema before the grammar engine sees it (tools and `response_format`).

The grammar engine (llguidance) crashes on, or accepts and only later fails on, schemas a
client can send; `check_schema` refuses them first, with the path of the part at fault
(`#/properties/a/maxLength`):

* nesting deeper than `MAX_DEPTH` containers (anywhere, even under an unknown keyword):
  copying or serialising it would exhaust Python's recursion limit;
* an integer outside the signed 64-bit range (`maxLength: 2**64` could not be serialised);
* a `pattern` (or a `patternProperties` key) that is not a regex the engine accepts, with
  its own detail (`unclosed character class`), not only its first line;
* a `$ref` loop: a schema that, through `$ref`, `allOf`, `anyOf` or `oneOf` alone, can only
  come back to itself, never to a value (`a: {$ref: b}, b: {$ref: a}`). The engine accepts
  it and fails when the model starts writing that value. A recursive schema that descends
  into the data (a tree whose `children` items are `{$ref: "#"}`) is fine.

No recursion here: every walk is iterative, so the checks themselves never overflow.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import llguidance

from ..errors import ToolSchemaError

MAX_DEPTH = 64  # nested objects/arrays in a schema; real tool schemas use under 10
INT64 = (-(2**63), 2**63 - 1)
# Schema keywords whose values are schemas (so walks never treat an `enum`, a `default`, or
# the name->schema map under `properties` as a schema).
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "not", "if", "then", "else",
              "contains", "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def pointer(path: tuple[Any, ...]) -> str:
    """`path` as a JSON pointer fragment: `#/properties/a/maxLength`."""
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def check_schema(schema: Any, where: str, error: type[Exception] = ToolSchemaError) -> None:
    """Raise `error` naming `where` and the path when `schema` is one of the kinds above."""
    _check_values(schema, where, error)
    nodes = dict(_schema_nodes(schema))
    for path, node in nodes.items():
        for regex, at in _patterns(node, path):
            _check_regex(regex, f"{where}: {pointer(at)}", error)
    looping = _ref_loops(schema, nodes)
    if looping:
        path = looping[0]
        raise error(f"{where}: {pointer(path)} is a $ref loop: following $ref/allOf/anyOf/oneOf "
                    f"from it only comes back to it, never to a value "
                    f"({_loop_text(nodes[path])})")


def _check_values(value: Any, where: str, error: type[Exception]) -> None:
    """Depth and integer range of every value (iterative)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and not INT64[0] <= item <= INT64[1]:
            raise error(f"{where}: {pointer(path)} is {item}, outside the 64-bit integer "
                        f"range (-2**63 to 2**63-1) a schema's numbers must fit in")
        if isinstance(item, dict | list):
            if len(path) >= MAX_DEPTH:
                raise error(f"{where}: nested deeper than {MAX_DEPTH} objects/arrays (at "
                            f"{pointer(path[:8])}/...)")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((sub, (*path, key)) for key, sub in pairs)


def _children(node: dict[str, Any], path: tuple[Any, ...]) -> Iterator[tuple[Any, tuple]]:
    for key in SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            yield from ((sub, (*path, key, name)) for name, sub in node[key].items())
    for key in SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from ((sub, (*path, key, i)) for i, sub in enumerate(node[key]))
    for key in SCHEMA_ONE:
        sub = node.get(key)
        if isinstance(sub, list):
            yield from ((s, (*path, key, i)) for i, s in enumerate(sub))
        elif sub is not None:
            yield sub, (*path, key)


def _schema_nodes(schema: Any) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(path, node) of every object schema under the keywords that hold schemas."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            yield path, node
            stack.extend(_children(node, path))


def _patterns(node: dict[str, Any], path: tuple) -> Iterator[tuple[str, tuple]]:
    if isinstance(node.get("pattern"), str):
        yield node["pattern"], (*path, "pattern")
    if isinstance(node.get("patternProperties"), dict):
        for key in node["patternProperties"]:
            yield key, (*path, "patternProperties", key)


def _check_regex(regex: str, where: str, error: type[Exception]) -> None:
    grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "string", "pattern": regex})
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        lines = [line.strip() for line in (messages[0] if messages else "").splitlines()]
        detail = next((line[len("error:"):].strip() for line in lines
                       if line.startswith("error:")), " ".join(filter(None, lines)))
        raise error(f"{where}: invalid regex {regex!r}: {detail or 'rejected'}")


def _resolve(schema: Any, ref: Any) -> tuple[Any, ...] | None:
    """The path a local `$ref` (`#`, `#/$defs/a`) points at; None when it is not one."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    if ref in ("#", "#/"):
        return ()
    if not ref.startswith("#/"):
        return None
    node, path = schema, []
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node, key = node[part], part
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node, key = node[int(part)], int(part)
        else:
            return None  # a dangling pointer: the engine names it at compile time
        path.append(key)
    return tuple(path)


def _ref_loops(schema: Any, nodes: dict[tuple, dict[str, Any]]) -> list[tuple]:
    """Paths of the schemas that can never reach a value: `grounded` is the least fixed point
    of "all of ($ref target, allOf members) grounded, and some anyOf/oneOf member grounded"
    (a worklist over reverse edges: linear in the schema's size)."""
    need_all: dict[tuple, list[tuple]] = {}
    need_any: dict[tuple, list[tuple]] = {}
    for path, node in nodes.items():
        alls = [(*path, "allOf", i) for i, _ in enumerate(node.get("allOf") or ())
                if isinstance(node.get("allOf"), list)]
        target = _resolve(schema, node.get("$ref")) if "$ref" in node else None
        if target is not None and target in nodes:
            alls.append(target)
        anys = [(*path, key, i) for key in ("anyOf", "oneOf") if isinstance(node.get(key), list)
                for i, _ in enumerate(node[key])]
        need_all[path] = [p for p in alls if p in nodes]
        need_any[path] = [p for p in anys if p in nodes]
    if not any(need_all.values()) and not any(need_any.values()):
        return []
    waiting = {path: len(deps) for path, deps in need_all.items()}
    any_ok = {path: not deps for path, deps in need_any.items()}
    users_all: dict[tuple, list[tuple]] = {}
    users_any: dict[tuple, list[tuple]] = {}
    for path in nodes:
        for dep in need_all[path]:
            users_all.setdefault(dep, []).append(path)
        for dep in need_any[path]:
            users_any.setdefault(dep, []).append(path)
    grounded: set[tuple] = set()
    work = [path for path in nodes if waiting[path] == 0 and any_ok[path]]
    while work:
        path = work.pop()
        if path in grounded:
            continue
        grounded.add(path)
        for user in users_all.get(path, ()):
            waiting[user] -= 1
            if waiting[user] == 0 and any_ok[user]:
                work.append(user)
        for user in users_any.get(path, ()):
            any_ok[user] = True
            if waiting[user] == 0:
                work.append(user)
    return sorted((p for p in nodes if p not in grounded), key=lambda p: (len(p), str(p)))


def _loop_text(node: dict[str, Any]) -> str:
    if "$ref" in node:
        return f"$ref {node['$ref']!r}"
    return "its " + "/".join(k for k in ("allOf", "anyOf", "oneOf") if k in node)
