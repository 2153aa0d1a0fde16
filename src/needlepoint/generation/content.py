"""Constrained message content: a plain answer that must be JSON matching a schema.

OpenAI's `response_format` (`{"type": "json_object"}`, `{"type": "json_schema", ...}`) and
`Needle.complete(..., response_format=schema)` constrain the *text* of an answer, through the
same engine as tool calls (llguidance). From the first token of the answer the mask allows:

    start: " "? %json{schema} <|im_end|>          the answer is the JSON value, then the end
         | " "? <tool_call>                       or (when calls are allowed) a tool call

The optional leading space is the dummy-prefix piece every answer starts with (training
encodes the answer on its own). The JSON is compact (no whitespace, `,` and `:`), as the
model writes JSON in its tool calls. Once `<tool_call>` is taken, the turn continues under
the tool-call grammar as usual. There is no `<think>` block in a constrained answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import llguidance

from ..errors import NeedlepointError
from .grammar import TokenVocab, ToolCallMatcher

JSON_OBJECT: dict[str, Any] = {"type": "object"}  # `{"type": "json_object"}`: any object
_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":",
            "coerce_one_of": True}


class ContentSchemaError(NeedlepointError, ValueError):
    """A response-format schema the grammar engine cannot compile (or that is not JSON)."""


class ContentGrammar:
    """The compiled content constraint of one schema; `start()` gives a matcher positioned
    at the start of the answer. `tool_call_id` None: no tool call may replace the JSON."""

    def __init__(self, vocab: TokenVocab, schema: Mapping[str, Any], *, im_end_id: int,
                 tool_call_id: int | None = None) -> None:
        if not isinstance(schema, Mapping):
            raise ContentSchemaError(f"the response schema must be a JSON schema object, got "
                                     f"{type(schema).__name__}")
        try:
            body = json.loads(json.dumps(schema, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ContentSchemaError(f"the response schema is not JSON: {exc}") from None
        body.setdefault("x-guidance", _OPTIONS)
        self.vocab = vocab
        self.schema = schema
        alternatives = [f'" "? body <[{int(im_end_id)}]>']
        if tool_call_id is not None:
            alternatives.append(f'" "? <[{int(tool_call_id)}]>')
        self.lark = ("start: " + "\n    | ".join(alternatives) + "\n"
                     f"body: %json {json.dumps(body, ensure_ascii=False)}\n")
        grammar = llguidance.LLMatcher.grammar_from_lark(self.lark)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        prototype = llguidance.LLMatcher(vocab._llg, grammar, log_level=0)
        if failed or prototype.is_error():
            message = messages[0] if messages else prototype.get_error()
            line = (message.strip().splitlines() or ["unknown error"])[0]
            raise ContentSchemaError(f"unsupported response schema: "
                                     f"{line.split('failed to compile JSON schema: ')[-1]}")
        prototype.compute_bitmask()  # lexer setup at compile time, not in the first step
        self._prototype = prototype

    def start(self) -> ToolCallMatcher:
        """A fresh matcher at the start of the answer (same interface as a call matcher)."""
        return ToolCallMatcher(self, self._prototype.deep_copy())  # type: ignore[arg-type]
