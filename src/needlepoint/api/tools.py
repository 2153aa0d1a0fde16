"""Tool definitions -> the `{"name", "description", "parameters"}` schemas the model reads.

Accepted: plain functions (signature -> parameter schema, docstring -> description and
Google-style `Args:` parameter descriptions; `@tool` only attaches a name/description
override), pydantic models (`model_json_schema()`; name = `__tool_name__` or the class name),
and JSON schema dicts (`{"name", "description", "parameters"}`, or OpenAI's
`{"type": "function", "function": {...}}`).

A parameter's schema is pydantic's (`TypeAdapter(hint).json_schema()`), so every hint pydantic
understands works: dates and times, unions, `Literal`, `Enum`, nested models, dataclasses,
`Annotated[float, Field(gt=0, le=10000, description="USD")]` constraints. The arguments the
model writes are converted back through the same adapter before the function runs. A top-level
`Optional[T]` is T's schema (optionality is `required`); pydantic's titles are dropped, and a
`Field(description=...)` wins over the docstring's.

Every problem (unsupported type hint, unannotated or variadic parameter, a value that is not
JSON-serialisable, duplicate names) is a `ToolSchemaError` raised when the tools are built.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from ..errors import ToolSchemaError
from ..generation.schema_checks import check_schema

SCALARS: dict[type, str] = {str: "string", bool: "boolean", int: "integer", float: "number"}
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
ARGS_HEADERS = ("args:", "arguments:", "parameters:", "params:")
PARAM_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
Converter = Callable[[Any], Any]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its wire schema plus, for Python tools, how to call it."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any] | None = None
    converters: Mapping[str, Converter] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        """The tool as the prompt lists it (keys in upstream's order)."""
        return {"name": self.name, "description": self.description,
                "parameters": self.parameters}

    def call(self, arguments: Mapping[str, Any]) -> Any:
        """Run the Python function with JSON arguments converted to the hinted types."""
        if self.function is None:
            raise ToolSchemaError(f"tool {self.name!r} has no Python function to run")
        kwargs = {key: self.converters.get(key, _identity)(value)
                  for key, value in arguments.items()}
        return self.function(**kwargs)


def _identity(value: Any) -> Any:
    return value


def tool(func: Callable | None = None, *, name: str | None = None,
         description: str | None = None) -> Any:
    """Mark a function as a tool (optionally renaming it or overriding its description).

    Usable bare (`@tool`) or with options (`@tool(name="x")`). The schema is built and checked
    right away, so a bad definition fails at import time, not at the first query."""

    def mark(f: Callable) -> Callable:
        f.__needle_tool__ = from_function(f, name=name, description=description)
        return f

    return mark(func) if func is not None else mark


# ---------------------------------------------------------------------------- type hints
def _is_pydantic_model(tp: Any) -> bool:
    return isinstance(tp, type) and callable(getattr(tp, "model_json_schema", None))


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's auto-generated "title" annotations (prompt noise), keeping properties
    that happen to be *named* title."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _pydantic_schema(model: type, defs: dict[str, Any]) -> dict[str, Any]:
    """A model's schema with its `$defs` hoisted into `defs` (refs stay `#/$defs/...`, which
    resolves against the parameters root where the caller puts them)."""
    schema = _strip_titles(model.model_json_schema())
    defs.update(schema.pop("$defs", {}))
    return schema


def _without_none(tp: Any) -> Any:
    """`Optional[T]` -> T (also inside `Annotated`): the parameter is then simply not
    required; a JSON `null` is never needed to leave it out."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        inner = _without_none(args[0])
        return tp if inner is args[0] else typing.Annotated[(inner, *tp.__metadata__)]
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        members = tuple(a for a in args if a is not type(None))
        if len(members) == 1:
            return members[0]
        return typing.Union[members]  # noqa: UP007 - built from a runtime tuple
    return tp


def _field_description(tp: Any) -> bool:
    """Whether an `Annotated` hint carries its own `Field(description=...)`."""
    if typing.get_origin(tp) is not typing.Annotated:
        return False
    return any(getattr(meta, "description", None) for meta in tp.__metadata__)


def _tidy(schema: dict[str, Any]) -> dict[str, Any]:
    """Keys in the order the prompt shows them best: type first, description last."""
    head = {k: schema[k] for k in ("type",) if k in schema}
    tail = {k: schema[k] for k in ("description",) if k in schema}
    return {**head, **{k: v for k, v in schema.items() if k not in head and k not in tail},
            **tail}


def type_schema(
    tp: Any, where: str, defs: dict[str, Any]
) -> tuple[dict[str, Any], Converter | None]:
    """JSON schema of a type hint (pydantic's) and the converter from its JSON value back to
    Python (None for plain str/int/float/bool)."""
    tp = _without_none(tp)
    if tp in SCALARS:
        return {"type": SCALARS[tp]}, None
    try:
        adapter = pydantic.TypeAdapter(tp)
        schema = adapter.json_schema(ref_template="#/$defs/{model}")
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticInvalidForJsonSchema,
            pydantic.PydanticUserError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ToolSchemaError(f"{where}: unsupported type hint {tp!r} (pydantic cannot "
                              f"describe it as JSON: {first})") from None
    schema = _strip_titles(schema)
    for name, sub in schema.pop("$defs", {}).items():
        if name in defs and defs[name] != sub:
            raise ToolSchemaError(f"{where}: two different types are both named {name!r}")
        defs[name] = sub
    return _tidy(schema), adapter.validate_python


# ---------------------------------------------------------------------------- docstrings
def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a docstring with a Google-style Args section.
    The description is the text before the first section, on one line."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section = "summary"
    base_indent: int | None = None
    current: str | None = None
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if indent == 0 and re.fullmatch(r"[A-Za-z][A-Za-z ]*:", stripped):
            section = "args" if stripped.lower() in ARGS_HEADERS else "other"
            base_indent, current = None, None
            continue
        if section == "summary":
            summary.append(stripped)
        elif section == "args" and stripped:
            base_indent = indent if base_indent is None else base_indent
            match = PARAM_LINE.match(stripped)
            if indent == base_indent and match:
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif current is not None:
                params[current] = f"{params[current]} {stripped}".strip()
    return " ".join(" ".join(summary).split()), params


# ---------------------------------------------------------------------------- constructors
def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ToolSchemaError(f"{what}: tool name {name!r} must be a non-empty identifier "
                              "(letters, digits, _ . -)")
    return name


def _check_json(value: Any, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ToolSchemaError(f"{where}: not JSON-serialisable ({error})") from None


def from_function(func: Callable, *, name: str | None = None,
                  description: str | None = None) -> ToolSpec:
    """A tool from a function's signature, type hints and docstring."""
    tool_name = _check_name(name or getattr(func, "__name__", None), repr(func))
    try:
        hints = typing.get_type_hints(func, include_extras=True)
        signature = inspect.signature(func)
    except (NameError, TypeError, ValueError) as error:
        raise ToolSchemaError(f"tool {tool_name!r}: cannot read its signature ({error})") from None
    summary, param_docs = parse_docstring(inspect.getdoc(func))
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Converter] = {}
    defs: dict[str, Any] = {}
    for param in signature.parameters.values():
        where = f"tool {tool_name!r} parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolSchemaError(f"{where}: *args, **kwargs and positional-only parameters "
                                  "cannot be passed as JSON arguments")
        if param.name not in hints:
            raise ToolSchemaError(f"{where} has no type hint")
        schema, convert = type_schema(hints[param.name], where, defs)
        schema = dict(schema)
        if param_docs.get(param.name) and not _field_description(hints[param.name]):
            schema["description"] = param_docs[param.name]
        properties[param.name] = schema
        if convert is not None:
            converters[param.name] = convert
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties,
                                  "required": required}
    if defs:
        parameters["$defs"] = defs
    spec = ToolSpec(tool_name, description if description is not None else summary,
                    parameters, func, converters)
    _check_json(spec.schema(), f"tool {tool_name!r}")
    return spec


def from_pydantic(model: type) -> ToolSpec:
    """A tool whose arguments are one pydantic model's fields (not executable by itself)."""
    name = _check_name(getattr(model, "__tool_name__", None) or model.__name__, repr(model))
    defs: dict[str, Any] = {}
    parameters = _pydantic_schema(model, defs)
    description = parameters.pop("description", None) or parse_docstring(model.__doc__)[0]
    if defs:
        parameters["$defs"] = defs
    spec = ToolSpec(name, description, parameters)
    _check_json(spec.schema(), f"tool {name!r}")
    return spec


def from_dict(schema: Mapping[str, Any]) -> ToolSpec:
    """A tool from a JSON schema dict (plain or OpenAI `{"type": "function", ...}` form)."""
    if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        schema = schema["function"]
    name = _check_name(schema.get("name"), "tool dict")
    description = schema.get("description", "")
    if not isinstance(description, str):
        raise ToolSchemaError(f"tool {name!r}: description must be a string")
    parameters = schema.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
        raise ToolSchemaError(f"tool {name!r}: parameters must be a JSON schema of type object")
    if not isinstance(parameters.get("properties", {}), Mapping):
        raise ToolSchemaError(f"tool {name!r}: parameters.properties must be an object")
    check_schema(parameters, f"tool {name!r}: parameters")  # before copying: depth, ints
    spec = ToolSpec(name, description, copy.deepcopy(dict(parameters)))
    _check_json(spec.schema(), f"tool {name!r}")
    return spec


def to_tool_spec(obj: Any) -> ToolSpec:
    """Whatever the user passed as a tool, as a `ToolSpec`."""
    if isinstance(obj, ToolSpec):
        return obj
    marked = getattr(obj, "__needle_tool__", None)
    if isinstance(marked, ToolSpec):
        return marked
    if isinstance(obj, Mapping):
        return from_dict(obj)
    if _is_pydantic_model(obj):
        return from_pydantic(obj)
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        return from_function(obj)
    raise ToolSchemaError(f"cannot make a tool from {obj!r}: pass a function, a pydantic model "
                          "or a JSON schema dict")


def tool_specs(tools: Iterable[Any]) -> list[ToolSpec]:
    """Build every tool, refusing duplicate names."""
    specs = [to_tool_spec(t) for t in tools]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ToolSchemaError(f"duplicate tool name {spec.name!r}")
        seen.add(spec.name)
    return specs
