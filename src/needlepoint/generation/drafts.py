"""Draft tokens for speculative decoding: prompt lookup and grammar fast-forward.

A draft is a guess at the next tokens, checked by the model in one multi-position pass
(`speculate.py`); a wrong guess costs a little compute and never changes the output. Two
sources:

* **prompt lookup** (`NgramIndex`): the longest recent n-gram match of the sequence's tail
  against the prompt and the output so far, and the tokens that followed it there. A tool
  call copies spans of the query (argument values) and of the tool list (names, keys), and a
  second call repeats the shape of the first. Tokens are matched by their text without a
  leading space (SentencePiece writes a query word as `▁Bang` and the same word after `"`
  as `Bang`), while the draft takes the real ids that followed;
* **grammar fast-forward**: the tokens the grammar forces next (`{"name":"` after `[{"`,
  the rest of a tool name once it is determined, `","arguments":`, `</tool_call><|im_end|>`
  after `]`), in the tokenizer's own encoding. They do not count against the lookup budget;
* **opening**: a turn that may call is drafted, with its prompt, to open the way training
  writes a call (`▁<tool_call>[{"name":"`), so its first tokens cost no pass of their own
  (`speculate.Speculator.prefill`).

`Drafter.propose` interleaves them: forced tokens whenever the grammar forces any, else a
lookup continuation, checked against a copy of the grammar state and cut at the first token
it rejects (and, in the free phase, at the first token the free phase never allows).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

LOOKUP, GRAMMAR, OPENING = "lookup", "grammar", "opening"  # draft sources
SOURCES = (LOOKUP, GRAMMAR, OPENING)
MAX_NGRAM = 4  # longest suffix matched
KEEP = 3  # occurrences remembered per n-gram
CANDIDATES = 4  # lookup continuations tried before giving up on a draft
MAX_DRAFT = 48  # tokens per draft, both sources (a rewind must reach back over them)


class DraftMatcher(Protocol):
    """The grammar state a draft is checked against (`ToolCallMatcher`)."""

    def fork(self) -> DraftMatcher: ...

    def forced_tokens(self) -> list[int]: ...

    def advance_prefix(self, token_ids: Sequence[int]) -> int: ...

    def is_finished(self) -> bool: ...


def match_keys(token_bytes: Sequence[bytes]) -> np.ndarray:
    """Per token id, the id its n-grams are matched by: the id of the same text without its
    leading spaces where the vocabulary has one (`▁Bang` -> `Bang`), else itself."""
    by_bytes: dict[bytes, int] = {}
    for i, b in enumerate(token_bytes):
        by_bytes.setdefault(bytes(b), i)
    keys = np.arange(len(token_bytes), dtype=np.int64)
    for i, b in enumerate(token_bytes):
        stripped = bytes(b).lstrip(b" ")
        if stripped and stripped != b:
            keys[i] = by_bytes.get(stripped, i)
    return keys


class NgramIndex:
    """Where each n-gram (n = 1..max_n, by match key) of a growing token sequence ended its
    last `KEEP` times, so the tail can be matched against earlier text."""

    def __init__(self, keys: np.ndarray | None = None, max_n: int = MAX_NGRAM) -> None:
        self.keys = keys
        self.max_n = max_n
        self.tokens: list[int] = []
        self._keyed: list[int] = []
        self._ends: dict[tuple[int, ...], tuple[int, ...]] = {}  # last KEEP ends, latest first

    def __len__(self) -> int:
        return len(self.tokens)

    def _key(self, token: int) -> int:
        keys = self.keys
        return int(keys[token]) if keys is not None and 0 <= token < len(keys) else token

    def extend(self, ids: Sequence[int]) -> None:
        """Append tokens to the indexed sequence."""
        for token in ids:
            token = int(token)
            self.tokens.append(token)
            self._keyed.append(self._key(token))
            end = len(self.tokens) - 1
            for n in range(1, min(self.max_n, end + 1) + 1):
                gram = tuple(self._keyed[end - n + 1 :])
                last = self._ends.get(gram, ())
                self._ends[gram] = (end, *last[: KEEP - 1])

    def candidates(self, tail: Sequence[int], limit: int) -> Iterator[list[int]]:
        """Continuations of `tail` (the indexed tokens, possibly followed by draft tokens),
        best first: up to `limit` tokens that followed an earlier occurrence of the n-gram
        ending `tail`, longest n first, the most recent occurrence first (the last `KEEP`
        occurrences of each n-gram are kept)."""
        for _, tokens in self.matches(tail, limit):
            yield tokens

    def matches(self, tail: Sequence[int], limit: int) -> Iterator[tuple[int, list[int]]]:
        """`candidates`, each with the length n of the n-gram it matched."""
        if limit <= 0 or not tail:
            return
        keyed = [self._key(int(t)) for t in tail[-self.max_n :]]
        last = len(self.tokens) - 1
        for n in range(len(keyed), 0, -1):
            hit = self._ends.get(tuple(keyed[-n:]))
            if hit is None:
                continue
            for end in hit:  # an occurrence that has a continuation in the indexed tokens
                if 0 <= end < last:
                    yield n, self.tokens[end + 1 : end + 1 + limit]

    def lookup(self, tail: Sequence[int], limit: int) -> list[int]:
        """The best continuation of `tail` (`candidates`), or [] when nothing matches."""
        return next(self.candidates(tail, limit), [])


def lookup_kind(n: int, first: bool) -> str:
    """The acceptance class of a lookup token: its n-gram length, and whether it starts a
    guess (a copy that has started tends to go on)."""
    return f"{LOOKUP}{n}{'' if first else '+'}"


@dataclass
class Draft:
    """Draft tokens, the source of each and its acceptance class (`kinds`: the source, or
    `lookup_kind` for lookup tokens)."""

    tokens: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, tokens: Sequence[int], source: str, n: int = 0) -> None:
        self.tokens.extend(int(t) for t in tokens)
        self.sources.extend([source] * len(tokens))
        if source == LOOKUP:
            self.kinds.extend(lookup_kind(n, i == 0) for i in range(len(tokens)))
        else:
            self.kinds.extend([source] * len(tokens))

    def cut(self, size: int) -> Draft:
        """The first `size` tokens."""
        return Draft(self.tokens[:size], self.sources[:size], self.kinds[:size])


@dataclass
class DraftState:
    """Where the turn is, as a draft needs it: the active grammar matcher (None when the
    output is unconstrained), whether the turn is still in its free phase, and how to start
    the call grammar should a draft write `<tool_call>` there."""

    matcher: DraftMatcher | None = None
    free: bool = False
    call_open: int | None = None
    constraint: Any = None  # has start() -> DraftMatcher, or None


class Drafter:
    """Proposes drafts from the index (prompt + accepted output) and the grammar state."""

    def __init__(self, index: NgramIndex, free_mask: np.ndarray | None = None,
                 stop_ids: Iterable[int] = ()) -> None:
        self.index = index
        self.free_mask = free_mask
        self.stop_ids = frozenset(int(t) for t in stop_ids)

    def _stop_cut(self, tokens: list[int]) -> tuple[list[int], bool]:
        """`tokens` up to the first stop token (a turn never steps one: drafting it would
        buy nothing), and whether one was cut."""
        for i, token in enumerate(tokens):
            if token in self.stop_ids:
                return tokens[:i], True
        return tokens, False

    def _free_cut(self, tokens: list[int]) -> list[int]:
        mask = self.free_mask
        if mask is None:
            return tokens
        for i, token in enumerate(tokens):
            if not (0 <= token < len(mask) and mask[token]):
                return tokens[:i]
        return tokens

    def _guess(self, tail: list[int], limit: int, matcher: DraftMatcher | None, free: bool
               ) -> tuple[list[int], bool, int]:
        """The first of a few lookup candidates whose first token the grammar (or the free
        phase) allows, cut where it stops allowing them (`matcher` advances over it); whether
        it was cut at a stop token; the length of its n-gram match."""
        for rank, (n, guess) in enumerate(self.index.matches(tail, limit)):
            if rank >= CANDIDATES:
                break
            guess, stop = self._stop_cut(guess)
            whole = len(guess)
            if free:
                guess = self._free_cut(guess)
            elif matcher is not None:
                guess = guess[: matcher.advance_prefix(guess)]
            if guess:
                return guess, stop and len(guess) == whole, n
        return [], False, 0

    def propose(self, state: DraftState, lookup_budget: int, room: int) -> Draft:
        """A draft of at most `room` tokens, at most `lookup_budget` of them from lookup."""
        draft = Draft()
        matcher = state.matcher.fork() if _lookahead(state.matcher) else None
        free = state.free and matcher is None
        tail = self.index.tokens[-MAX_NGRAM:]
        room = min(room, MAX_DRAFT)
        while len(draft) < room:
            if matcher is not None:
                if matcher.is_finished():
                    break
                forced, stop = self._stop_cut(matcher.forced_tokens()[: room - len(draft)])
                if forced:
                    forced = forced[: matcher.advance_prefix(forced)]
                if forced:
                    draft.add(forced, GRAMMAR)
                    tail = (tail + forced)[-MAX_NGRAM:]
                if stop:
                    break
                if forced:
                    continue
            if lookup_budget <= 0:
                break
            guess, stop, n = self._guess(tail, min(lookup_budget, room - len(draft)), matcher,
                                         free)
            if not guess:
                break
            if free and state.call_open in guess:  # the draft enters the call: grammar on
                guess, stop, free = guess[: guess.index(state.call_open) + 1], False, False
                if _lookahead(state.constraint):
                    matcher = state.constraint.start()
                    matcher = matcher if _lookahead(matcher) else None
            draft.add(guess, LOOKUP, n)
            lookup_budget -= len(guess)
            tail = (tail + guess)[-MAX_NGRAM:]
            if stop:
                break
        return draft


def _lookahead(obj: Any) -> bool:
    """Whether a matcher (or a constraint's matchers) can check drafts: `fork`,
    `forced_tokens` and `advance_prefix` (`ToolCallMatcher`), or `start` for a constraint."""
    if obj is None:
        return False
    if hasattr(obj, "start") and not hasattr(obj, "fork"):
        return True
    return all(callable(getattr(obj, name, None))
               for name in ("fork", "forced_tokens", "advance_prefix", "is_finished"))
