"""Grammars and vocabularies for a chat format whose call markers are text (`TemplateFormat`).

The whole answer is one grammar, from its first token (the `content` constraint of
`turn.generate_turn`), so the choice between answering and calling is explicit: for
`tool_choice="auto"` the first token either starts the call marker or starts plain text:

    start: "<tool_call>" calls "</tool_call>" <end>      a call (names limited to the
         | TEXT <end>                                   declared tools, arguments per schema)

where `calls` is (list body) a JSON list of calls (`calls_lark`: one or several, a tool
possibly more than once; `[]` only when a call is not required), or (object body) one call
object per marker pair, at least one, laid out as the template lays them out (Qwen:
`<tool_call>\n{...}\n</tool_call>`, blocks separated by a newline; `call_syntax.JsonBlocks`),
or FunctionGemma's `call:NAME{...}` blocks (`functiongemma_grammar.py`). TEXT is
any text that does not start with `<` or whitespace and never contains the call marker.
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
from .content import _OPTIONS, ContentSchemaError
from .functiongemma_grammar import functiongemma_calls_lark
from .grammar import MAX_TOOLS, TokenVocab, ToolCallGrammar, ToolCallMatcher, tool_parts
from .route import fence_start_mask
from .segments import MarkerIds
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


def marker_bytes(chat_format: Any) -> tuple[list[bytes], set[int]]:
    """Every token's bytes, the call markers spelled out even when they are special added
    tokens (so they match as text), and the ids that stay special."""
    tokenizer = chat_format.tokenizer
    token_bytes = tokenizer.all_token_bytes()
    types = np.asarray(tokenizer.types)
    special = set(np.flatnonzero((types == UNKNOWN) | (types == CONTROL)).tolist())
    markers = getattr(tokenizer, "markers", {})
    for text in (chat_format.call_open, chat_format.call_close):
        if text in markers:
            token_bytes[markers[text]] = text.encode("utf-8")
            special.discard(markers[text])
    return token_bytes, special


def token_vocab(chat_format: Any) -> TokenVocab:
    """The grammar engine's view of a template model's tokenizer: control tokens are
    special, the turn ends at the format's end ids; text is encoded as the tokenizer does."""
    tokenizer = chat_format.tokenizer
    token_bytes, special = marker_bytes(chat_format)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return TokenVocab(token_bytes, sorted(special), tokenizer.eos_id, chat_format.end_ids,
                      encode)


def turn_vocab(chat_format: Any) -> TurnVocab:
    """The turn loop's view of a template model: markers as text, the format's end ids."""
    tokenizer = chat_format.tokenizer
    ends = chat_format.end_ids
    thinks = getattr(chat_format, "think_ids", None) or (-1, -1)
    markers = MarkerIds(think_open=thinks[0], think_close=thinks[1], tool_call_open=-1,
                        tool_call_close=-1, im_end=ends[0], eos=ends[-1])
    types = np.asarray(tokenizer.types)
    token_bytes, special = marker_bytes(chat_format)
    escape = getattr(chat_format, "escape_id", None)
    if escape is not None and getattr(chat_format, "call_translator", None):
        token_bytes[escape] = b"<escape>"  # FunctionGemma's string marker, read as text
    free = (types == NORMAL_TYPE) | (types == BYTE_TYPE) | (types == USER_DEFINED)
    for text in (chat_format.call_open, chat_format.call_close, "<escape>"):
        marker = getattr(tokenizer, "markers", {}).get(text)
        if marker is not None and (text != "<escape>" or chat_format.call_translator):
            free[marker] = True  # a call marker that is one added token
    free[list(ends)] = True
    free[[t for t in thinks if t >= 0]] = True
    from .drafts import match_keys

    return TurnVocab(token_bytes=token_bytes, markers=markers, free_mask=free, call_prefix=(),
                     think_close_ids=(), match_keys=match_keys(token_bytes),
                     text_markers=(chat_format.call_open, chat_format.call_close),
                     call_start=call_start_mask(token_bytes, chat_format.call_open),
                     fence_start=fence_start_mask(token_bytes),
                     call_body=chat_format.call_body, closing=_closing(chat_format, token_bytes),
                     call_translator=getattr(chat_format, "call_translator", None))


def _closing(chat_format: Any, token_bytes: list[bytes]) -> np.ndarray:
    """`closing_mask` for this format: its closing marker's characters in the last tier, and
    FunctionGemma's `<escape>` (which ends a string) in the first."""
    marker = getattr(chat_format, "call_suffix", "") + chat_format.call_close
    closing = closing_mask(token_bytes, marker)
    escape = getattr(chat_format, "escape_id", None)
    if escape is not None and getattr(chat_format, "call_translator", None):
        closing[0, escape] = True
    return closing


def calls_lark(parts: list[tuple[str, dict]], chat_format: Any, require: bool,
               parallel: bool) -> str:
    """`calls_list`: the calls between the markers. List body: `[call, call, ...]`; object
    body: `call</tool_call>\n<tool_call>call...`. Unlike Needle's grammar a tool may be
    called more than once (OpenAI parallel calls: the same function for two cities); one
    call only without `parallel`; `[]` only when a call is not required (list body)."""
    per_tool = [line for line in ToolCallGrammar._lark(parts, (), True, True).splitlines()
                if line.startswith(("call", "args")) and not line.startswith("calls")]
    choice = "call: " + " | ".join(f"call{i}" for i in range(len(parts)))
    if chat_format.call_body == "object":
        prefix = getattr(chat_format, "call_prefix", "")
        suffix = getattr(chat_format, "call_suffix", "")
        separator = getattr(chat_format, "call_separator", "\n")
        quoted = [json.dumps(t) if t else "" for t in (prefix, suffix)]
        block = " ".join(p for p in (quoted[0], "call", quoted[1]) if p)
        between = json.dumps(f"{chat_format.call_close}{separator}{chat_format.call_open}")
        head = f"calls_list: {block}" + (f" ({between} {block})*" if parallel else "")
    else:
        some = 'call ("," call)*' if parallel else "call"
        head = f'calls_list: "[" {some} "]"' + ("" if require else ' | "[]"')
    return "\n".join([head, choice, *per_tool]) + "\n"


def spaced(lark: str) -> str:
    """A call grammar's JSON with `", "` and `": "` separators (`json.dumps`' default, the
    style chat templates render calls in and the Hermes-style prompt shows) instead of the
    compact style of Needle's wire format."""
    return (lark.replace('{\\"name\\":', '{\\"name\\": ')
            .replace(',\\"arguments\\":', ', \\"arguments\\": ')
            .replace('("," call)*', '(", " call)*')
            .replace('"item_separator": ","', '"item_separator": ", "')
            .replace('"key_separator": ":"', '"key_separator": ": "'))


class AnswerGrammar:
    """The whole-answer grammar of one request; `start()` gives a fresh matcher."""

    def __init__(self, vocab: TokenVocab, chat_format: Any, tools: Sequence[Mapping[str, Any]],
                 *, call: bool = True, text: bool = True, require_call: bool = False,
                 parallel_calls: bool = True, schema: Mapping[str, Any] | None = None,
                 strict_formats: bool = False) -> None:
        if len(tools) > MAX_TOOLS:
            raise ToolSchemaError(f"{len(tools)} tools: at most {MAX_TOOLS} are supported")
        self.vocab = vocab
        # the tools a text answer may still call in JSON outside the template's syntax
        # (`api/call_salvage.text_calls`): a call or text, no content schema
        self.text_call_tools = [dict(t) for t in tools] if call and text and schema is None \
            else None
        # EOS is never a grammar token: the engine allows it once the answer is complete
        ends = " ".join(f"<[{i}]>" for i in dict.fromkeys(vocab.end_ids) if i != vocab.eos_id)
        alternatives, rules = [], []
        functiongemma = getattr(chat_format, "syntax", None) == "functiongemma"
        if call and functiongemma and not tools and not require_call:
            call = False  # no tool to call: FunctionGemma's names have no empty alternative
        if call:
            parts = [tool_parts(tool, i, strict_formats) for i, tool in enumerate(tools)]
            names = [name for name, _ in parts]
            if len(set(names)) != len(names):
                raise ToolSchemaError("a tool name is declared twice")
            if require_call and not parts:
                raise ToolSchemaError("a call is required, but no tools are declared")
            alternatives.append(f"{json.dumps(chat_format.call_open)} calls_list "
                                f"{json.dumps(chat_format.call_close)} {ends}")
            if functiongemma:
                body = functiongemma_calls_lark(parts, chat_format.escape_id, parallel_calls)
            else:
                body = calls_lark(parts, chat_format, require_call, parallel_calls)
            if getattr(chat_format, "json_style", "compact") == "spaced" and not functiongemma:
                body = spaced(body)
            rules.append(body)
        if schema is not None:
            body_schema = json.loads(json.dumps(dict(schema), allow_nan=False))
            body_schema.setdefault("x-guidance", _OPTIONS)
            rules.append(f"content: %json {json.dumps(body_schema, ensure_ascii=False)}")
            alternatives.append(f"content {ends}")
        elif text:
            rules.append(TEXT_RULE.replace("<tool_call>", chat_format.call_open))
            alternatives.append(f"TEXT {ends}")
        if not alternatives:
            raise ToolSchemaError("an answer must allow a call or text")
        head = "start: " + "\n    | ".join(alternatives)
        if getattr(chat_format, "thinking", False):  # Qwen3: `<think>...</think>` may come first
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
