"""Schema-constrained tool calls: a token mask that only lets the model write valid calls.

After `<tool_call>` the model must write a compact JSON array of calls (training format,
`json.dumps(calls, separators=(",", ":"), ensure_ascii=False)`), then `</tool_call>` and
`<|im_end|>`:

    [{"name":"set_alarm","arguments":{"time":"06:45"}}]</tool_call><|im_end|>

The grammar is an llguidance Lark grammar (design notes and engine comparison:
docs/grammar.md). Each call is `{"name":<declared name>,"arguments":<object>}` with the
arguments checked by llguidance's JSON-schema compiler (keys in schema property order, no
whitespace, no undeclared keys); `[]` is always allowed. "No tool twice in one turn" is a
parametric rule: the rule parameter is a 64-bit set of the tools already used, so the
grammar stays linear in the number of tools and the rule is exact, never a post-hoc filter.

Three objects, each built once for what it depends on:

* `TokenVocab`: the tokenizer's token bytes (llguidance token trie), once per tokenizer;
* `ToolCallGrammar`: the compiled grammar, once per (vocab, tools), reusable across turns;
* `ToolCallMatcher`: one per generation, from `ToolCallGrammar.start()`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import llguidance
import numpy as np

from ..errors import NeedlepointError, TokenizerError, ToolSchemaError
from .tool_schema import tool_parts

MAX_TOOLS = 64  # the used-tool set is the 64-bit parameter of a parametric rule


class GrammarError(NeedlepointError, ValueError):
    """A token the tool-call grammar does not allow at this point (or a misused matcher)."""


class TokenVocab:
    """A tokenizer as the grammar engine sees it: the raw bytes of every token.

    `special_ids` (control, unknown, chat markers) are never allowed inside the JSON; the
    grammar refers to them by id. `end_ids` are the special tokens forced after the closing
    `]` (for Needle: `</tool_call>`, `<|im_end|>`); EOS is allowed only after them.
    `encode(text)` tokenizes a fragment as it would continue after a chat marker (no dummy
    prefix); it only picks the ids of grammar-forced text (`forced_tokens`), and a greedy
    longest-match tokenizer stands in when it is None or disagrees with the bytes.
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        special_ids: Iterable[int],
        eos_id: int,
        end_ids: Sequence[int] = (),
        encode: Callable[[str], list[int]] | None = None,
    ) -> None:
        n = len(token_bytes)
        special = {int(i) for i in special_ids}
        for what, ids in (("special", special), ("end", end_ids), ("eos", (eos_id,))):
            bad = [i for i in ids if not 0 <= int(i) < n]
            if bad:
                raise TokenizerError(f"{what} token ids {bad} outside the vocabulary [0, {n})")
        if not special.issuperset(end_ids):
            raise TokenizerError(f"end_ids {list(end_ids)} must be special tokens")
        # llguidance marks special tokens by a leading 0xFF byte (never in UTF-8 text); a
        # byte piece <0xFF> or an empty piece can never be part of JSON, so they join them.
        special |= {i for i, b in enumerate(token_bytes) if not b or b[0] == 0xFF}
        self.vocab_size = n
        self.eos_id = int(eos_id)
        self.end_ids = tuple(int(i) for i in end_ids)
        self.special_ids = frozenset(special)
        self.token_bytes = [bytes(b) for b in token_bytes]
        self._encode = encode
        self._by_bytes = self._canonical_ids()
        self._longest = max(map(len, self._by_bytes), default=1)
        # Twins: a byte piece <0x22> and the piece '"' spell the same bytes. The mask
        # offers only the canonical one (the id the tokenizer emits, the only one the model
        # saw in training); llguidance alone would offer both in free text.
        twins = [(i, self._by_bytes[b]) for i, b in enumerate(self.token_bytes)
                 if i not in special and self._by_bytes[b] != i]
        self.twin_ids = np.array([t for t, _ in twins], dtype=np.intp)
        self._twin_canon = np.array([c for _, c in twins], dtype=np.intp)
        marked = [b"\xff" + (b or b"[%d]" % i) if i in special else b
                  for i, b in enumerate(self.token_bytes)]
        wrapper = _Wrapper(marked, sorted(special), self.eos_id, self._tokenize)
        self._llg = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapper))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenVocab:
        """From a `needlepoint.tokenizer.Tokenizer` (duck-typed: `all_token_bytes()`, `types`,
        `eos_id`, `marker_id()`, `encode()`)."""
        types = np.asarray(tokenizer.types)
        special = np.flatnonzero((types >= 1) & (types <= 3)).tolist()  # unknown/control/user
        opener = tokenizer.marker_id("<tool_call>")
        ends = (tokenizer.marker_id("</tool_call>"), tokenizer.marker_id("<|im_end|>"))

        def encode(text: str) -> list[int]:
            # Text after a marker is BPE'd on its own, without the dummy prefix: exactly
            # how the JSON after `<tool_call>` is tokenized in training.
            ids = tokenizer.encode("<tool_call>" + text)
            return ids[ids.index(opener) + 1 :]

        return cls(tokenizer.all_token_bytes(), special, tokenizer.eos_id, ends, encode)

    def _canonical_ids(self) -> dict[bytes, int]:
        """bytes -> the id spelling them: the tokenizer's choice when several ids do,
        else the highest (SentencePiece numbers byte pieces before merged pieces)."""
        groups: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.token_bytes):
            if i not in self.special_ids:
                groups.setdefault(b, []).append(i)
        out = {}
        for b, ids in groups.items():
            pick = ids[-1]
            if len(ids) > 1 and self._encode is not None:
                try:
                    encoded = self._encode(b.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    encoded = []
                if len(encoded) == 1 and encoded[0] in ids:
                    pick = encoded[0]
            out[b] = pick
        return out

    def _tokenize(self, data: bytes) -> list[int]:
        """llguidance's tokenizer callback: `encode` when it reproduces `data` exactly."""
        if self._encode is not None:
            try:
                ids = self._encode(data.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                ids = None
            if ids is not None and all(0 <= i < self.vocab_size for i in ids) and \
                    not self.special_ids.intersection(ids) and \
                    b"".join(self.token_bytes[i] for i in ids) == data:
                return ids
        return self._greedy(data)

    def _greedy(self, data: bytes) -> list[int]:
        out, pos = [], 0
        while pos < len(data):
            for size in range(min(self._longest, len(data) - pos), 0, -1):
                tid = self._by_bytes.get(data[pos : pos + size])
                if tid is not None:
                    out.append(tid)
                    pos += size
                    break
            else:
                pos += 1  # a byte no token spells (no byte fallback): it cannot be produced
        return out


class _Wrapper:
    """The duck-typed tokenizer object `llguidance.TokenizerWrapper` expects."""

    def __init__(self, tokens: list[bytes], special: list[int], eos: int,
                 tokenize: Callable[[bytes], list[int]]) -> None:
        self.tokens, self.special_token_ids, self.eos_token_id = tokens, special, eos
        self.bos_token_id = None
        self._tokenize = tokenize

    def __call__(self, data: bytes) -> list[int]:
        return self._tokenize(data)


def _engine_message(message: str) -> str:
    """The useful line of an llguidance error (it appends the grammar source)."""
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line.split("failed to compile JSON schema: ", 1)[-1]


class ToolCallGrammar:
    """The tool-call grammar for one tool list; `start()` gives a fresh matcher per turn.

    `strict_formats=True` enforces `format` (date, time, email, uuid, ...) as llguidance
    defines them; by default `format` is an annotation only (see `tool_schema.closed_schema`).
    `require_call=True` leaves out `[]` (at least one call: OpenAI `tool_choice="required"`);
    `parallel_calls=False` allows at most one call (`parallel_tool_calls=false`)."""

    def __init__(self, vocab: TokenVocab, tools: Sequence[Mapping[str, Any]], *,
                 strict_formats: bool = False, require_call: bool = False,
                 parallel_calls: bool = True) -> None:
        if isinstance(tools, Mapping | str | bytes) or not isinstance(tools, Sequence):
            raise ToolSchemaError(f"tools must be a list of tool dicts, got {type(tools).__name__}")
        if len(tools) > MAX_TOOLS:
            raise ToolSchemaError(f"{len(tools)} tools: at most {MAX_TOOLS} are supported")
        self.vocab = vocab
        parts = [tool_parts(tool, i, strict_formats) for i, tool in enumerate(tools)]
        self.tool_names = tuple(name for name, _ in parts)
        seen: set[str] = set()
        for name in self.tool_names:
            if name in seen:
                raise ToolSchemaError(f"tool name {name!r} is declared twice")
            seen.add(name)
        if require_call and not parts:
            raise ToolSchemaError("a call is required, but no tools are declared")
        self.require_call, self.parallel_calls = bool(require_call), bool(parallel_calls)
        self.lark = self._lark(parts, vocab.end_ids, self.require_call, self.parallel_calls)
        prototype = llguidance.LLMatcher(vocab._llg, llguidance.LLMatcher.grammar_from_lark(
            self.lark), log_level=0)
        if prototype.is_error():
            for name, schema in parts:  # find the tool at fault, for a useful message
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
                failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
                if failed:
                    raise ToolSchemaError(f"tool {name!r}: unsupported parameters schema: "
                                          f"{_engine_message(messages[0])}")
            message = _engine_message(prototype.get_error())
            raise ToolSchemaError(f"tool grammar rejected: {message}")
        # The first mask of a fresh grammar builds lexer state (~ms): pay it here, at
        # compile time, not in the first decode step; start()'s copies share that state.
        prototype.compute_bitmask()
        self._prototype = prototype  # matchers are deep copies (~1 us instead of ~ms)

    @staticmethod
    def _lark(parts: list[tuple[str, dict]], end_ids: tuple[int, ...], require: bool = False,
              parallel: bool = True) -> str:
        """`[` calls `]` end-markers, where `calls::S` (S = set of used tools, as bits) offers
        tool i only when bit i of S is clear, then continues with bit i set. Without
        `parallel`, `calls` is one call or none; `require` drops the empty alternative."""
        ends = " ".join(f"<[{i}]>" for i in end_ids)
        if not parts:
            return f'start: "[]" {ends}\n'
        empty = [] if require else ['""']
        if not parallel:
            lines = [f'start: "[" calls "]" {ends}',
                     "calls: " + "\n    | ".join(empty + [f"call{i}" for i in range(len(parts))])]
        else:
            first = empty + [f"call{i} more::set_bit({i})" for i in range(len(parts))]
            more = ['""'] + [f'"," call{i} more::set_bit({i}) %if bit_clear({i})'
                             for i in range(len(parts))]
            lines = [f'start: "[" calls::0x0 "]" {ends}',
                     "calls::_ : " + "\n    | ".join(first),
                     "more::_ : " + "\n    | ".join(more)]
        return "\n".join(lines + ToolCallGrammar.call_rules(parts)) + "\n"

    @staticmethod
    def call_rules(parts: list[tuple[str, dict]]) -> list[str]:
        """The lark rules of one call of each tool: `call{i}` (`{"name":NAME,"arguments":`
        `args{i}` `}`) and `args{i}` (its parameters' JSON schema), i in `parts`' order; the
        call syntaxes of template models (`call_syntax.py`) build their grammars on them."""
        lines = []
        for i, (name, schema) in enumerate(parts):
            head = '{"name":' + json.dumps(name, ensure_ascii=False) + ',"arguments":'
            lines.append(f'call{i}: {json.dumps(head, ensure_ascii=False)} args{i} "}}"')
            lines.append(f"args{i}: %json {json.dumps(schema, ensure_ascii=False)}")
        return lines

    def start(self) -> ToolCallMatcher:
        """A matcher positioned right after `<tool_call>` (the caller emitted that marker)."""
        return ToolCallMatcher(self, self._prototype.deep_copy())


class ToolCallMatcher:
    """One generation's grammar state. Loop: `allowed_mask()` (or `mask_logits`), sample,
    `advance(token)`, until `is_finished()` (after the last end id, e.g. `<|im_end|>`)."""

    def __init__(self, grammar: ToolCallGrammar, matcher: llguidance.LLMatcher) -> None:
        self.grammar = grammar
        self._vocab = grammar.vocab
        self._m = matcher
        self._bits = np.zeros((self._vocab.vocab_size + 31) // 32, dtype=np.int32)
        self._ptr = self._bits.ctypes.data  # the buffer is reused: no per-step allocation
        self.tokens: list[int] = []  # accepted ids, in order (read-only for callers)

    def _fill(self) -> None:
        self._m.unsafe_compute_mask_ptr(self._ptr, self._bits.nbytes)
        if self._m.is_error():
            raise GrammarError(f"grammar engine error: {_engine_message(self._m.get_error())}")

    def allowed_mask(self) -> np.ndarray:
        """bool[vocab_size]: the tokens to sample from next (a fresh array, ~15 us at vocab
        8192). It is a subset of what `advance` accepts: grammar-forced text (a tool name,
        a key, `","arguments":`) is offered only in its canonical tokenization, and
        byte-piece twins only as the canonical piece, so sampling stays on the token
        sequences the model was trained on."""
        self._fill()
        mask = np.unpackbits(self._bits.view(np.uint8), count=self._vocab.vocab_size,
                             bitorder="little").view(bool)
        vocab = self._vocab
        if vocab.twin_ids.size:
            np.logical_or.at(mask, vocab._twin_canon, mask[vocab.twin_ids])
            mask[vocab.twin_ids] = False
        return mask

    def mask_logits(self, logits: np.ndarray) -> np.ndarray:
        """Set disallowed entries of `logits` (1-D, >= vocab_size; extra output ids count as
        disallowed) to -inf in place, and return it."""
        allowed = self.allowed_mask()
        n = self._vocab.vocab_size
        if logits.ndim != 1 or logits.shape[0] < n:
            raise GrammarError(f"logits shape {logits.shape}: expected 1-D with >= {n} entries")
        np.copyto(logits[:n], -np.inf, where=~allowed)
        logits[n:] = -np.inf
        return logits

    def advance(self, token_id: int) -> None:
        """Accept one token whose bytes continue a valid answer (any tokenization, so a
        teacher-forced or externally sampled answer is judged by its text); GrammarError,
        with the state unchanged, otherwise."""
        tid = int(token_id)
        if tid == self._vocab.eos_id and self._m.is_accepting():
            ok = self._m.consume_token(tid)  # try_consume_tokens never takes EOS
        else:
            ok = 0 <= tid < self._vocab.vocab_size and self._m.try_consume_tokens([tid]) == 1
        if not ok:
            raise GrammarError(self._rejection(tid))
        self.tokens.append(tid)

    def _rejection(self, tid: int) -> str:
        tail = self.text()[-60:]
        if not 0 <= tid < self._vocab.vocab_size:
            what = "outside the vocabulary"
        else:
            what = repr(self._vocab.token_bytes[tid] or b"<special>")
        forced = self._m.compute_ff_bytes()
        hint = f"; the grammar forces {forced!r} here" if forced else ""
        return (f"token {tid} ({what}) is not allowed after {len(self.tokens)} tokens "
                f"ending {tail!r}{hint}")

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (fast-forward), tokenized by the vocab's `encode`;
        empty when there is a choice. Does not advance: feed them to `advance` and the model."""
        return list(self._m.compute_ff_tokens())

    def is_finished(self) -> bool:
        """True once the array and every end id have been accepted (only EOS may follow)."""
        return self._m.is_accepting()

    def fork(self) -> ToolCallMatcher:
        """An independent copy of this state (to look ahead, e.g. check a draft)."""
        other = ToolCallMatcher(self.grammar, self._m.deep_copy())
        other.tokens = list(self.tokens)
        return other

    def advance_prefix(self, token_ids: Sequence[int]) -> int:
        """Accept the longest prefix of `token_ids` that continues a valid answer (as
        `advance` judges tokens, EOS excepted); returns how many were accepted."""
        ids = [int(t) for t in token_ids]
        n = len(ids)
        for i, tid in enumerate(ids):
            if not 0 <= tid < self._vocab.vocab_size:
                n = i
                break
        taken = self._m.try_consume_tokens(ids[:n]) if n else 0
        self.tokens.extend(ids[:taken])
        return taken

    def text(self) -> bytes:
        """The bytes accepted so far (special tokens contribute nothing)."""
        vocab = self._vocab
        return b"".join(vocab.token_bytes[t] for t in self.tokens if t not in vocab.special_ids)

    def calls(self) -> list[dict[str, Any]]:
        """The parsed calls, once the closing `]` has been accepted (GrammarError before):
        the text starts with `[`, so no proper prefix of it parses as JSON."""
        try:
            return json.loads(self.text())
        except ValueError:
            raise GrammarError("the call array is not complete yet") from None
