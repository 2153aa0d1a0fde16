"""Grammars and vocabularies for a chat format whose call markers are text (`TemplateFormat`).

The whole answer is one grammar, from its first token (the `content` constraint of
`turn.generate_turn`), so the choice between answering and calling is explicit: for
`tool_choice="auto"` the first token either starts the call marker or starts plain text:

    start: "<tool_call>" calls "</tool_call>" <end>      a call (names limited to the
         | TEXT <end>                                   declared tools, arguments per schema)

where `calls` is the chat format's call syntax (`call_syntax.py`, one class per syntax, chosen
once by `syntaxes.syntax_for`): a JSON list of calls (`hermes`), one JSON call object per
marker pair laid out as the template lays them out (`qwen`), FunctionGemma's `call:NAME{...}`
blocks (`functiongemma`), with the markers it names. TEXT is any text that does not start
with `<` or whitespace and never contains the call marker.
`<end>` is the format's end-of-turn token unless that is EOS (which the engine allows
whenever the answer is complete). `required`
and a named tool keep only the call; a `response_format` schema replaces TEXT with the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import llguidance
import numpy as np

from ..errors import ToolSchemaError
from ..formats.chat_format import TemplateFormat
from .call_syntax import CallSyntax
from .content import _OPTIONS, ContentSchemaError
from .grammar import MAX_TOOLS, TokenVocab, ToolCallMatcher, tool_parts
from .marker_tokens import call_starts, marker_pieces
from .route import fence_start_mask
from .segments import MarkerIds
from .syntaxes import syntax_for
from .text_markers import call_start_mask, closing_mask
from .turn_config import BYTE_TYPE, NORMAL_TYPE, TurnVocab

USER_DEFINED, CONTROL, UNKNOWN = 3, 2, 1
# `tool_choice="auto"` on a template model: the model's own choice calls or answers
# (`route.py`); a threshold would decline calls the model gives less probability. Off: a
# calibrated value is fitted on BFCL live_* (docs/benchmarks_bfcl.md).
AUTO_CALL_THRESHOLD: float | None = None
TEXT_RULE = r"TEXT: /[^<\s](?s:.)*/ & ~/(?s:.*)<tool_call>(?s:.*)/"
# A thinking template's reasoning block before the answer (Qwen3 with enable_thinking): any text
# up to the first `</think>`, then optional whitespace.
THINK_RULES = ('think_part: think_block THINK_SPACE?\n'
               'think_block[stop="</think>"]: "<think>" /(?s:.*)/\n'
               'THINK_SPACE: /\\s+/\n')


def marker_bytes(fmt: TemplateFormat, syntax: CallSyntax) -> tuple[list[bytes], set[int]]:
    """Every token's bytes, the call markers spelled out even when they are special added
    tokens (so they match as text), and the ids that stay special."""
    token_bytes = fmt.tokenizer.all_token_bytes()
    types = np.asarray(fmt.tokenizer.types)
    special = set(np.flatnonzero((types == UNKNOWN) | (types == CONTROL)).tolist())
    for text in (syntax.open, syntax.close):
        if text in fmt.markers:
            token_bytes[fmt.markers[text]] = text.encode("utf-8")
            special.discard(fmt.markers[text])
    return token_bytes, special


def token_vocab(fmt: TemplateFormat, syntax: CallSyntax | None = None) -> TokenVocab:
    """The grammar engine's view of a template model's tokenizer: control tokens are
    special, the turn ends at the format's end ids; text is encoded as the tokenizer does."""
    tokenizer = fmt.tokenizer
    token_bytes, special = marker_bytes(fmt, syntax or _syntax(fmt))

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return TokenVocab(token_bytes, sorted(special), tokenizer.eos_id, fmt.end_ids, encode)


def turn_vocab(fmt: TemplateFormat, syntax: CallSyntax | None = None) -> TurnVocab:
    """The turn loop's view of a template model: markers as text, the format's end ids."""
    syntax = syntax or _syntax(fmt)
    ends = fmt.end_ids
    thinks = fmt.think_ids or (-1, -1)
    markers = MarkerIds(think_open=thinks[0], think_close=thinks[1], tool_call_open=-1,
                        tool_call_close=-1, im_end=ends[0], eos=ends[-1])
    types = np.asarray(fmt.tokenizer.types)
    token_bytes, special = marker_bytes(fmt, syntax)
    string = syntax.string_marker  # FunctionGemma's `<escape>`: read as text in a call
    if string is not None and string in fmt.markers:
        token_bytes[fmt.markers[string]] = string.encode("utf-8")
    free = (types == NORMAL_TYPE) | (types == BYTE_TYPE) | (types == USER_DEFINED)
    for text in (syntax.open, syntax.close, *([string] if string else [])):
        if text in fmt.markers:
            free[fmt.markers[text]] = True  # a call marker that is one added token
    free[list(ends)] = True
    free[[t for t in thinks if t >= 0]] = True
    from .drafts import match_keys

    ids = (fmt.markers.get(syntax.open, -1), fmt.markers.get(syntax.close, -1))

    return TurnVocab(token_bytes=token_bytes, markers=markers, free_mask=free, call_prefix=(),
                     think_close_ids=(), match_keys=match_keys(token_bytes),
                     text_markers=(syntax.open, syntax.close),
                     call_start=call_start_mask(token_bytes, syntax.open),
                     fence_start=fence_start_mask(token_bytes),
                     call_body=syntax.body, closing=_closing(fmt, syntax, token_bytes),
                     call_translator=syntax.translator(),
                     marker_pieces=marker_pieces(token_bytes, {
                         text: fmt.markers[text] for text in (syntax.open, syntax.close)
                         if text in fmt.markers}),
                     call_marker_ids=ids,
                     call_starts=call_starts(token_bytes, ids[0]) if ids[1] >= 0 else None)


def _syntax(fmt: TemplateFormat) -> CallSyntax:
    syntax = syntax_for(fmt)
    assert syntax is not None  # a TemplateFormat always has one
    return syntax


def _closing(fmt: TemplateFormat, syntax: CallSyntax, token_bytes: list[bytes]) -> np.ndarray:
    """`closing_mask` for this syntax: its closing text's characters in the last tier, and
    a string marker (FunctionGemma's `<escape>`, which ends a string) in the first."""
    closing = closing_mask(token_bytes, syntax.closing())
    string = syntax.string_marker
    if string is not None and string in fmt.markers:
        closing[0, fmt.markers[string]] = True
    return closing


class AnswerGrammar:
    """The whole-answer grammar of one request; `start()` gives a fresh matcher."""

    def __init__(self, vocab: TokenVocab, fmt: TemplateFormat,
                 tools: Sequence[Mapping[str, Any]], *, call: bool = True, text: bool = True,
                 require_call: bool = False, parallel_calls: bool = True,
                 schema: Mapping[str, Any] | None = None, strict_formats: bool = False,
                 syntax: CallSyntax | None = None) -> None:
        if len(tools) > MAX_TOOLS:
            raise ToolSchemaError(f"{len(tools)} tools: at most {MAX_TOOLS} are supported")
        syntax = syntax or _syntax(fmt)
        self.vocab = vocab
        # the tools a text answer may still call in JSON outside the template's syntax
        # (`api/call_salvage.text_calls`): a call or text, no content schema
        self.text_call_tools = [dict(t) for t in tools] if call and text and schema is None \
            else None
        # EOS is never a grammar token: the engine allows it once the answer is complete
        ends = " ".join(f"<[{i}]>" for i in dict.fromkeys(vocab.end_ids) if i != vocab.eos_id)
        alternatives, rules = [], []
        if call and syntax.needs_tools and not tools and not require_call:
            call = False  # no tool to call, and the syntax has no empty call list
        if call:
            parts = [tool_parts(tool, i, strict_formats) for i, tool in enumerate(tools)]
            names = [name for name, _ in parts]
            if len(set(names)) != len(names):
                raise ToolSchemaError("a tool name is declared twice")
            if require_call and not parts:
                raise ToolSchemaError("a call is required, but no tools are declared")
            alternatives.append(f"{json.dumps(syntax.open)} calls_list "
                                f"{json.dumps(syntax.close)} {ends}")
            rules.append(syntax.calls_lark(parts, require_call, parallel_calls, fmt.json_style))
        if schema is not None:
            body_schema = json.loads(json.dumps(dict(schema), allow_nan=False))
            body_schema.setdefault("x-guidance", _OPTIONS)
            rules.append(f"content: %json {json.dumps(body_schema, ensure_ascii=False)}")
            alternatives.append(f"content {ends}")
        elif text:
            rules.append(TEXT_RULE.replace("<tool_call>", syntax.open))
            alternatives.append(f"TEXT {ends}")
        if not alternatives:
            raise ToolSchemaError("an answer must allow a call or text")
        head = "start: " + "\n    | ".join(alternatives)
        if fmt.thinking:  # Qwen3: `<think>...</think>` may come first
            head = ("start: think_part? answer\n" + THINK_RULES + "answer: "
                    + "\n    | ".join(alternatives))
        self.lark = head + "\n" + "\n".join(rules) + "\n"
        grammar = llguidance.LLMatcher.grammar_from_lark(self.lark)
        prototype = llguidance.LLMatcher(vocab._llg, grammar, log_level=0)
        if prototype.is_error():
            message = (prototype.get_error().strip().splitlines() or ["unknown error"])[0]
            error = ContentSchemaError if schema is not None else ToolSchemaError
            raise error(f"answer grammar rejected: {message}")
        prototype.compute_bitmask()
        self._prototype = prototype

    def start(self) -> ToolCallMatcher:
        return ToolCallMatcher(self, self._prototype.deep_copy())  # type: ignore[arg-type]
