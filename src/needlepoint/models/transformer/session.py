"""One decode state per sequence: a KV cache per layer, the tokens consumed, the chunk size.

A session holds state and nothing else: `prefill`, `step` and `extend` hand its caches and
tokens to the model's one forward (`runner.Runner.run`), which advances the caches; the
session then records the tokens. A decode `step` is a chunk of one, so both fill the same
caches; with int8 numerics the caches are int8 and every row is computed on its own, so the
logits of a position are the same bits whatever the chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..protocol import SessionCapabilities
from .runner import CHUNK, Request, Runner


class HasRunner(Protocol):
    """What a session needs of its model (the model itself: `TransformerModel`)."""

    runner: Runner


class TransformerSession:
    """Incremental decoding state of one sequence (`model.session()`)."""

    def __init__(self, model: HasRunner, chunk: int = CHUNK) -> None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        self.model = model
        self.chunk = chunk
        self.caches = model.runner.new_caches()
        self.tokens: list[int] = []

    @property
    def capabilities(self) -> SessionCapabilities:
        """`models/protocol.py`: extend/rewind, fork, a chunk. Exact numerics compute int8 rows
        one by one: `extend` gives the bits of single steps and `rewind` is exact, so
        speculative decoding may verify drafts (generation/speculate.py)."""
        return SessionCapabilities(extend=True, rewind=True, fork=True, chunk=self.chunk,
                                   exact=self.model.runner.numerics.exact)

    @property
    def position(self) -> int:
        """Tokens consumed so far (the position the next token takes)."""
        return len(self.tokens)

    def consumed(self) -> np.ndarray:
        return np.asarray(self.tokens, np.int64)

    def fork(self) -> TransformerSession:
        """An independent copy of this state (both may continue differently)."""
        other = TransformerSession.__new__(TransformerSession)
        other.model, other.chunk = self.model, self.chunk
        other.caches = {i: cache.copy() for i, cache in self.caches.items()}
        other.tokens = list(self.tokens)
        return other

    __copy__ = fork

    def extend(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Consume `ids`; the logits [len(ids), vocab] after each of them."""
        return self.run(ids, "all")

    def rewind(self, count: int) -> None:
        """Forget the last `count` tokens. Exact: every cache holds the values it held before
        those tokens were consumed (a sliding-window cache that no longer holds them is
        rebuilt from the tokens kept, `kv_cache.py`)."""
        if isinstance(count, bool) or not isinstance(count, int) or not \
                0 <= count <= len(self.tokens):
            raise ValueError(f"rewind count must be in 0..{len(self.tokens)}, got {count!r}")
        if count == 0:
            return
        position = len(self.tokens) - count
        del self.tokens[position:]
        self._cut_caches()

    def _cut_caches(self) -> None:
        """Cut every cache back to the tokens consumed: in place where each can, else the
        caches are rebuilt by running the tokens again (same bits in int8 numerics)."""
        position = self.position
        if all(cache.can_rewind_to(position) for cache in self.caches.values()):
            for cache in self.caches.values():
                cache.rewind_to(position)
            return
        self.caches = self.model.runner.new_caches()
        if position:
            self.model.runner.run([Request(self.caches, self.consumed(), 0, "none",
                                           self.chunk)])

    def prefill(self, ids: Sequence[int] | np.ndarray, logits: bool = True) -> np.ndarray | None:
        """Consume `ids` (after anything already consumed); the logits [vocab] at the last of
        them, or None (no LM head at all) with `logits=False`."""
        out = self.run(ids, "last" if logits else "none")
        return None if out is None else out[-1]

    def step(self, token_id: int) -> np.ndarray:
        """Consume one token; the logits [vocab] for the next position."""
        return self.run([token_id], "last")[-1]

    def run(self, ids: Any, want: str, hidden: list[np.ndarray] | None = None
            ) -> np.ndarray | None:
        """Consume `ids`; logits of every position (`want="all"`), of the last ("last"), or
        none. `hidden`, if given, receives [L+1, T, d] residual states per chunk (the last
        after the final norm), as transformers' `output_hidden_states`."""
        return run_sessions(self.model.runner, [(self, ids, want, hidden)])[0]

    def request(self, ids: Any, want: str, hidden: list[np.ndarray] | None = None) -> Request:
        """`ids` (checked) after the tokens consumed, as a request of the batch forward."""
        tokens = self.model.runner.check_ids(ids, self.position)
        return Request(self.caches, tokens, self.position, want, self.chunk, hidden)


def run_sessions(runner: Runner, items: Sequence[tuple[TransformerSession, Any, str,
                                                        list[np.ndarray] | None]]
                 ) -> list[np.ndarray | None]:
    """One batch forward over several sessions (session, ids, want, hidden): each session's
    caches advance and it records its tokens; if the forward fails, every session keeps the
    state it had (its caches cut back to its tokens)."""
    requests = [session.request(ids, want, hidden) for session, ids, want, hidden in items]
    try:
        out = runner.run(requests)
    except BaseException:
        for session, *_ in items:
            session._cut_caches()  # a failed chunk leaves no half-written rows
        raise
    for (session, *_), request in zip(items, requests, strict=True):
        session.tokens.extend(int(t) for t in request.tokens)
    return out


__all__ = ["CHUNK", "TransformerSession", "run_sessions"]
