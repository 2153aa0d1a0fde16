"""One decode state per sequence: a KV cache per layer, shared read-only model weights.

`prefill` runs the prompt in chunks of `chunk` positions (default `CHUNK`) through the same
code a decode `step` uses (a step is a chunk of one), so both fill the same caches; only the
rows whose logits are asked for go through the final norm and the LM head. With int8 numerics
the caches are `int8.Int8KVCache`s and every row is computed on its own, so the logits of a
position are the same bits whatever the chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..protocol import SessionCapabilities
from .attention import KVCache
from .int8 import Int8KVCache

if TYPE_CHECKING:  # pragma: no cover
    from .model import TransformerModel

# Positions per prefill chunk: bounds the [heads, CHUNK, positions] score temporaries.
CHUNK = 256


class TransformerSession:
    """Incremental decoding state of one sequence (`model.session()`)."""

    def __init__(self, model: TransformerModel, chunk: int = CHUNK) -> None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        self.model = model
        # int8 rows are computed one by one: `extend` gives the bits of single steps, so
        # speculative decoding may verify drafts (generation/speculate.py)
        self.exact_extend = model.numerics == "int8"
        self.chunk = chunk
        self.caches = self._new_caches()
        self.tokens: list[int] = []

    def _new_caches(self) -> list[KVCache | Int8KVCache]:
        spec = self.model.config
        layers = self.model.weights.layers
        if self.model.numerics == "int8":
            return [Int8KVCache(spec.num_kv_heads, spec.head_dim, spec.max_seq_len)
                    for _ in layers]
        return [KVCache(spec.num_kv_heads, spec.head_dim, spec.max_seq_len) for _ in layers]

    @property
    def capabilities(self) -> SessionCapabilities:
        """`models/protocol.py`: extend/rewind (exact in int8 numerics), fork, a chunk."""
        return SessionCapabilities(extend=True, rewind=True, fork=True, chunk=self.chunk,
                                   exact=self.model.numerics == "int8")

    @property
    def position(self) -> int:
        """Tokens consumed so far (the position the next token takes)."""
        return len(self.tokens)

    def consumed(self) -> np.ndarray:
        return np.asarray(self.tokens, np.int64)

    def fork(self) -> TransformerSession:
        """An independent copy of this state (both may continue differently)."""
        other = TransformerSession.__new__(TransformerSession)
        other.model = self.model
        other.chunk = self.chunk
        other.caches = [cache.copy() for cache in self.caches]
        other.tokens = list(self.tokens)
        return other

    __copy__ = fork

    def extend(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Consume `ids`; the logits [len(ids), vocab] after each of them."""
        return self.run(ids, "all")

    def rewind(self, count: int) -> None:
        """Forget the last `count` tokens: every layer's KV cache is cut back to the shorter
        length (the rows beyond it are overwritten by the next tokens). Exact: the cache holds
        the same values it held before those tokens were consumed."""
        if isinstance(count, bool) or not isinstance(count, int) or not \
                0 <= count <= len(self.tokens):
            raise ValueError(f"rewind count must be in 0..{len(self.tokens)}, got {count!r}")
        if count == 0:
            return
        for cache in self.caches:
            cache.rewind_to(cache.length - count)
        del self.tokens[len(self.tokens) - count :]

    def prefill(self, ids: Sequence[int] | np.ndarray, logits: bool = True) -> np.ndarray | None:
        """Consume `ids` (after anything already consumed); the logits [vocab] at the last of
        them, or None (no LM head at all) with `logits=False`."""
        out = self.run(ids, "last" if logits else "none")
        return None if out is None else out[-1]

    def step(self, token_id: int) -> np.ndarray:
        """Consume one token; the logits [vocab] for the next position."""
        return self.run([token_id], "last")[-1]

    def run(self, ids, want: str, hidden: list[np.ndarray] | None = None) -> np.ndarray | None:
        """Consume `ids`; logits of every position (`want="all"`), of the last ("last"), or
        none. `hidden`, if given, receives [L+1, T, d] residual states per chunk (the last
        after the final norm), as transformers' `output_hidden_states`."""
        model = self.model
        tokens = model.check_ids(ids, self.position)
        outputs = []
        size = self.chunk
        for first in range(0, len(tokens), size):
            chunk = tokens[first : first + size]
            last_chunk = first + size >= len(tokens)
            rows = "all" if want == "all" else ("last" if want == "last" and last_chunk else "")
            logits = self._chunk(chunk, rows, hidden)
            if logits is not None:
                outputs.append(logits)
        if not outputs:
            return None
        return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]

    def _chunk(self, tokens: np.ndarray, rows: str, hidden: list | None) -> np.ndarray | None:
        model = self.model
        spec, weights = model.config, model.weights
        start = self.position
        h = model.embed(tokens, start)
        states = [h.copy()] if hidden is not None else None
        h = model.run_layers(0, spec.num_layers, h, self, start, states=states)
        self.tokens.extend(int(t) for t in tokens)
        if states is not None:
            states[-1] = weights.final_norm(h)
            hidden.append(np.stack(states))
        if not rows:
            return None
        picked = h if rows == "all" else h[-1:]
        return weights.lm_head(weights.final_norm(picked))
