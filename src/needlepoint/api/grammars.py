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
from ..generation import answer_grammar
from ..generation.content import JSON_OBJECT, ContentGrammar, ContentSchemaError
from ..generation.grammar import TokenVocab, ToolCallGrammar
from ..generation.schema_checks import check_schema
from ..generation.syntaxes import syntax_for
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
        self._vocabs: weakref.WeakKeyDictionary[Any, dict[Any, TokenVocab]] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, tokenizer: Any, chat_format: Any = None) -> TokenVocab:
        """The vocab of `tokenizer` (Needle's markers), or of a template `chat_format`'s."""
        syntax = syntax_for(chat_format) if chat_format is not None else None
        # one per call-marker pair: a template's call syntax decides which markers are text
        key = (None, None) if syntax is None else (syntax.open, syntax.close)
        with self._lock:
            per_markers = self._vocabs.setdefault(tokenizer, {})
            vocab = per_markers.get(key)
            if vocab is None:
                vocab = TokenVocab.from_tokenizer(tokenizer) if syntax is None \
                    else answer_grammar.token_vocab(chat_format, syntax)
                per_markers[key] = vocab
            return vocab


GRAMMAR_VOCABS = _TokenVocabCache()


class _TurnVocabCache:
    """A template format's turn vocabulary (~0.3-1 s over a 49k vocabulary), built once per
    format object and shared read-only by every `Needle` (one per server request)."""

    def __init__(self) -> None:
        self._vocabs: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, chat_format: Any) -> Any:
        with self._lock:
            syntax = syntax_for(chat_format)
            per_syntax = self._vocabs.setdefault(chat_format, {})
            vocab = per_syntax.get(syntax.name)  # a syntax registered later has its own
            if vocab is None:
                vocab = per_syntax[syntax.name] = answer_grammar.turn_vocab(chat_format, syntax)
            return vocab


TURN_VOCABS = _TurnVocabCache()


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

    def __init__(self, tokenizer: Any, *, tool_grammar: bool = True,
                 chat_format: Any = None) -> None:
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        # a template model's call syntax (whole-answer grammars); None: Needle's wire format
        self.syntax = syntax_for(chat_format) if chat_format is not None else None
        self.whole_answer = self.syntax is not None
        self.tool_grammar = tool_grammar
        self._calls = _Lru(CACHED_GRAMMARS)
        self._content = _Lru(CACHED_GRAMMARS)

    @property
    def vocab(self) -> TokenVocab:
        return GRAMMAR_VOCABS.get(self.tokenizer, self.chat_format)

    def compile(self, schemas: list[dict[str, Any]], *, require_call: bool = False,
                parallel_calls: bool = True) -> Any:
        """The call grammar: Needle's (after `<tool_call>`), or for a template format the
        whole-answer grammar (a call, or text unless a call is required)."""
        if not self.tool_grammar:
            return None
        if self.whole_answer:
            return answer_grammar.AnswerGrammar(
                self.vocab, self.chat_format, schemas, text=not require_call,
                require_call=require_call, parallel_calls=parallel_calls, syntax=self.syntax)
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

    def content(self, schema: dict[str, Any], *, allow_call: bool,
                tools: list[dict[str, Any]] | None = None, parallel_calls: bool = True) -> Any:
        """The (cached) content grammar for a response schema; `allow_call`: a tool call may
        come instead of the JSON (for a template format: a call to one of `tools`). The schema is
        checked first (`check_schema`) and its unbounded numbers bounded to int64
        (`bounded_schema`)."""
        check_schema(schema, "response_format schema", ContentSchemaError)
        schema = bounded_schema(schema)
        key = (json.dumps(schema, sort_keys=True, default=str), bool(allow_call))
        if self.whole_answer:
            names = tuple(t["name"] for t in tools or [])
            return self._content.get((*key, names, parallel_calls),
                                     lambda: answer_grammar.AnswerGrammar(
                self.vocab, self.chat_format, tools or [], call=allow_call and bool(tools),
                parallel_calls=parallel_calls, schema=schema, syntax=self.syntax))
        markers = self.tokenizer.marker_id
        return self._content.get(key, lambda: ContentGrammar(
            self.vocab, schema, im_end_id=markers("<|im_end|>"),
            tool_call_id=markers("<tool_call>") if allow_call else None))
