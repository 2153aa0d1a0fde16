"""Jinja chat templates (`tokenizer_config.json` `chat_template`, GGUF `tokenizer.chat_template`).

Rendered the way transformers' `apply_chat_template` renders them, so a model sees the prompt
it was trained on: a sandboxed, immutable Jinja environment with `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that is plain `json.dumps`
(no key sorting, no HTML escaping, non-ASCII kept), the globals `raise_exception` and
`strftime_now`, `{% generation %}` blocks rendered as their body, and the variables `messages`,
`tools`, `documents`, `add_generation_prompt` plus the special-token strings (`bos_token`,
`eos_token`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from ..errors import TokenizerError
from .hf_extra import hf_extra


def _jinja() -> Any:
    with hf_extra("rendering a chat template needs `jinja2`", TokenizerError):
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    return jinja2


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TokenizerError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(source: str) -> Any:
    """The compiled template (cached by source text); a syntax error is a TokenizerError."""
    jinja2 = _jinja()

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (assistant-mask markers): the body only."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TokenizerError(f"chat template does not parse: {error}") from None


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: Mapping[str, str] | None = None,
    **variables: Any,
) -> str:
    """The prompt text of `messages` (and `tools`, as JSON-schema dicts) under `source`."""
    jinja2 = _jinja()
    template = compile_template(source)
    context = dict(special_tokens or {})
    context.update(variables)
    try:
        return template.render(
            messages=[dict(m) for m in messages],
            tools=None if tools is None else [dict(t) for t in tools],
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **context,
        )
    except jinja2.TemplateError as error:
        raise TokenizerError(f"chat template failed to render: {error}") from None
