"""A decode session: one sequence's state behind `prefill` / `step` (seed 002 `V2State` +
`step`, seed 000 "Skip logits during prefill")."""

from __future__ import annotations

import copy

import numpy as np

from ...errors import ModelInputError
from ..protocol import SessionCapabilities
from ..rewind import rewind_count
from .forward import Core, Trace, forward_chunk
from .heads import confidence_logit
from .state import V2State

# Prompt positions per batched prefill call: big enough for BLAS, small enough that the
# attention scores of a chunk ([H, chunk, ring + chunk]) stay a few MB.
PREFILL_CHUNK = 128


def as_token_ids(ids: object, vocab: int) -> np.ndarray:
    """Validate a token sequence: 1-D integers in [0, vocab), at least one."""
    try:
        array = np.asarray(ids)
    except (TypeError, ValueError) as error:
        raise ModelInputError(f"token ids must be a sequence of ints: {error}") from None
    if array.ndim != 1:
        raise ModelInputError(f"token ids must be 1-D, got shape {array.shape}")
    if array.size == 0:
        raise ModelInputError("token ids are empty: a sequence needs at least one token")
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise ModelInputError(f"token ids must be integers, got dtype {array.dtype}")
    bad = (array < 0) | (array >= vocab)
    if bad.any():
        where = int(np.argmax(bad))
        raise ModelInputError(
            f"token id {int(array[where])} at index {where} is outside the vocabulary [0, {vocab})"
        )
    return array.astype(np.int64)


class V2Session:
    """Independent decode state over a loaded model. Create with `V2Model.session()`."""

    def __init__(
        self,
        core: Core,
        kv_window: int,
        *,
        cache_len: int | None = None,
        max_tokens: int | None = None,
        trace: Trace | None = None,
    ) -> None:
        self._core = core
        self._state = V2State(core.cfg, kv_window, cache_len, max_tokens)
        self._trace = trace

    @property
    def position(self) -> int:
        """Tokens consumed so far (the logical position of the next one)."""
        return self._state.position

    @property
    def capabilities(self) -> SessionCapabilities:
        """`models/protocol.py`: extend/rewind (not bit-exact steps), fork, pooled head."""
        return SessionCapabilities(extend=True, rewind=True, fork=True, confidence=True)

    @property
    def kv_window(self) -> int:
        """Attention window in force (0 = full causal)."""
        return self._state.kv_window

    @property
    def cache_len(self) -> int:
        """Positions the KV ring holds."""
        return self._state.cache_len

    @property
    def tokens(self) -> np.ndarray:
        """The ids consumed so far."""
        return self._state.history[: self._state.position].copy()

    def set_kv_window(self, kv_window: int | None) -> None:
        """Change the window from the next token on (None = the archive's); the cache is
        not rewritten. ModelInputError if this session's cache is too small for it."""
        self._state.set_kv_window(self._core.cfg.kv_window if kv_window is None else kv_window)

    def fork(self) -> V2Session:
        """An independent copy of this session (both may continue differently)."""
        other = copy.copy(self)
        other._state = self._state.copy()
        return other

    def prefill(
        self,
        ids: object,
        logits: bool = True,
        *,
        trace: Trace | None = None,
        cells: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Consume `ids` (appending to what came before) in batched chunks; return the
        `[vocab]` logits at the last of them (None with `logits=False`, which skips the LM
        head entirely). `cells` [len(ids), L+1, C] receives the probe-head cells."""
        tokens = as_token_ids(ids, self._core.cfg.vocab)
        self._state.check_room(tokens.size)
        trace = trace or self._trace
        out = None
        for start in range(0, tokens.size, PREFILL_CHUNK):
            chunk = tokens[start : start + PREFILL_CHUNK]
            last = start + chunk.size == tokens.size
            rows = slice(-1, None) if logits and last else None
            part = None if cells is None else cells[start : start + chunk.size]
            out = forward_chunk(self._core, self._state, chunk, rows, trace, part)
        return None if out is None else out[0]

    def prefill_all(self, ids: object, *, trace: Trace | None = None) -> np.ndarray:
        """Consume `ids` and return logits at every one of them, `[len(ids), vocab]`."""
        tokens = as_token_ids(ids, self._core.cfg.vocab)
        self._state.check_room(tokens.size)
        trace = trace or self._trace
        out = []
        for start in range(0, tokens.size, PREFILL_CHUNK):
            chunk = tokens[start : start + PREFILL_CHUNK]
            out.append(forward_chunk(self._core, self._state, chunk, slice(None), trace))
        return np.concatenate(out) if len(out) > 1 else out[0]

    def step(self, token_id: int, *, trace: Trace | None = None) -> np.ndarray:
        """Consume one token; return the `[vocab]` logits for the next."""
        if isinstance(token_id, bool) or not isinstance(token_id, int | np.integer):
            raise ModelInputError(f"token id must be an int, got {token_id!r}")
        vocab = self._core.cfg.vocab
        if not 0 <= token_id < vocab:
            raise ModelInputError(f"token id {token_id} is outside the vocabulary [0, {vocab})")
        self._state.check_room(1)
        token = np.array([token_id], np.int64)
        return forward_chunk(self._core, self._state, token, slice(None), trace or self._trace)[0]

    def extend(self, ids: object) -> np.ndarray:
        """Consume `ids`; logits after each of them, `[len(ids), vocab]` (a multi-position step;
        the same as `prefill_all`, named as the Needle 3 session's)."""
        return self.prefill_all(ids)

    def rewind(self, n: int) -> None:
        """Undo the last `n` positions: the state is rebuilt by re-running the kept tokens
        (Needle 2's float numerics: equal to the original steps to float rounding)."""
        n = rewind_count(n, self.position)
        if n == 0:
            return
        kept = self.tokens[: self.position - n]
        self._state.reset()
        if len(kept):
            self.prefill(kept, logits=False)

    def confidence_logit(self) -> float | None:
        """The confidence head over every token consumed so far, full causal as upstream's
        head runs (recomputed, since this session's cache may be windowed); None without
        the head."""
        head = self._core.weights.confidence
        if head is None:
            return None
        if not self.position:
            raise ModelInputError("confidence_logit: the session has consumed no tokens")
        return confidence_logit(full_causal_cells(self._core, self.tokens), head)

    def reset(self) -> None:
        """Forget the sequence, keeping the allocations."""
        self._state.reset()


def full_causal_cells(core: Core, tokens: np.ndarray) -> np.ndarray:
    """Probe-head cells `[S, L+1, C]` of a full-causal pass over validated `tokens` (README
    "Probe heads": window 0, upstream's default for the heads, even though the LM path is
    windowed); a cache of exactly S positions, and no LM head."""
    cfg = core.cfg
    cells = np.empty((tokens.size, cfg.num_layers + 1, cfg.d_model), np.float32)
    session = V2Session(core, 0, max_tokens=tokens.size)
    session.prefill(tokens, logits=False, cells=cells)
    return cells
