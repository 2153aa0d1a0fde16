"""The compiled constraints a `Needle` decodes under, built once and reused.

* `GRAMMAR_VOCABS`: the grammar engine's view of a tokenizer (~0.2 s to build), shared
  read-only by every `Needle` over that tokenizer;
* `GrammarCache`: tool-call grammars per (offered tools, call required, parallel calls) and
  content grammars per response schema, each a few ms to compile, kept LRU-bounded;
* `content_schema`: what `response_format` means as a JSON schema.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from ..errors import InvalidOptionError
from ..generation.content import JSON_OBJECT, ContentGrammar, ContentSchemaError
from ..generation.grammar import TokenVocab, ToolCallGrammar
from ..generation.schema_checks import check_schema
from ..generation.tool_schema import bounded_schema

# Compiled grammars kept per key: a few ms each to build, but a chat app asks the same kinds
# of question again, so recent ones are worth keeping (bounded).
CACHED_GRAMMARS = 16
RESPONSE_FORMATS = ('None, "text", "json" / {"type": "json_object"} (any JSON object), '
                    '{"type": "json_schema", "json_schema": {"schema": {...}}}, a JSON schema '
                    'dict, or a pydantic model class')


class _TokenVocabCache:
    """Built once per tokenizer object and shared read-only; entries go away with their
    tokenizer."""

    def __init__(self) -> None:
        self._vocabs: weakref.WeakKeyDictionary[Any, TokenVocab] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, tokenizer: Any) -> TokenVocab:
        with self._lock:
            vocab = self._vocabs.get(tokenizer)
            if vocab is None:
                vocab = self._vocabs[tokenizer] = TokenVocab.from_tokenizer(tokenizer)
            return vocab


GRAMMAR_VOCABS = _TokenVocabCache()


def content_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema a `response_format` asks the answer text to match (None: free text)."""
    fmt = response_format
    if fmt is None or fmt == "text" or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return None
    if fmt == "json" or (isinstance(fmt, Mapping) and fmt.get("type") == "json_object"):
        return dict(JSON_OBJECT)
    if isinstance(fmt, type) and callable(getattr(fmt, "model_json_schema", None)):
        return fmt.model_json_schema()
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise InvalidOptionError("response_format json_schema needs "
                                     '{"json_schema": {"schema": {...}}}')
        return dict(schema)
    if isinstance(fmt, Mapping):
        return dict(fmt)  # a JSON schema itself
    raise InvalidOptionError(f"response_format must be {RESPONSE_FORMATS}; got {fmt!r}")


class _Lru:
    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = self.items[key] = build()
        if len(self.items) > self.size:
            self.items.popitem(last=False)
        return value


class GrammarCache:
    """One `Needle`'s compiled grammars. `tool_grammar=False` (the grammar switched off):
    `calls` gives None, while content grammars (an explicit response_format) still compile."""

    def __init__(self, tokenizer: Any, *, tool_grammar: bool = True) -> None:
        self.tokenizer = tokenizer
        self.tool_grammar = tool_grammar
        self._calls = _Lru(CACHED_GRAMMARS)
        self._content = _Lru(CACHED_GRAMMARS)

    @property
    def vocab(self) -> TokenVocab:
        return GRAMMAR_VOCABS.get(self.tokenizer)

    def compile(self, schemas: list[dict[str, Any]], *, require_call: bool = False,
                parallel_calls: bool = True) -> ToolCallGrammar | None:
        if not self.tool_grammar:
            return None
        return ToolCallGrammar(self.vocab, schemas, require_call=require_call,
                               parallel_calls=parallel_calls)

    def calls(self, schemas: list[dict[str, Any]], *, require_call: bool = False,
              parallel_calls: bool = True) -> ToolCallGrammar | None:
        """The (cached) call grammar for these tools and flags."""
        if not self.tool_grammar:
            return None
        key = (tuple(s["name"] for s in schemas), bool(require_call), bool(parallel_calls))
        return self._calls.get(key, lambda: self.compile(
            schemas, require_call=require_call, parallel_calls=parallel_calls))

    def content(self, schema: dict[str, Any], *, allow_call: bool) -> ContentGrammar:
        """The (cached) content grammar for a response schema; `allow_call`: a tool call may
        come instead of the JSON. The schema is checked first (`check_schema`) and its
        unbounded numbers bounded to int64 (`bounded_schema`)."""
        check_schema(schema, "response_format schema", ContentSchemaError)
        schema = bounded_schema(schema)
        markers = self.tokenizer.marker_id
        key = (json.dumps(schema, sort_keys=True, default=str), bool(allow_call))
        return self._content.get(key, lambda: ContentGrammar(
            self.vocab, schema, im_end_id=markers("<|im_end|>"),
            tool_call_id=markers("<tool_call>") if allow_call else None))
