"""Token ids a model is asked to consume, checked once for every model family."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ModelInputError


def check_token_ids(
    ids: Sequence[int] | np.ndarray, vocab: int, max_seq_len: int, position: int = 0
) -> np.ndarray:
    """`ids` as int64 [n], or a ModelInputError naming what is wrong: not integers, not one
    sequence, empty, outside [0, vocab), or past `max_seq_len` after `position` tokens."""
    try:
        tokens = np.asarray(ids)
    except (TypeError, ValueError) as error:
        raise ModelInputError(f"token ids must be integers: {error}") from None
    if tokens.ndim == 0:
        tokens = tokens.reshape(1)
    if tokens.ndim != 1:
        raise ModelInputError(f"token ids must be one sequence, got shape {tokens.shape}")
    if tokens.size == 0:
        raise ModelInputError("empty token sequence")
    if not np.issubdtype(tokens.dtype, np.integer):
        whole = np.issubdtype(tokens.dtype, np.floating) and np.all(tokens == np.round(tokens))
        if not whole:
            raise ModelInputError(f"token ids must be integers, got dtype {tokens.dtype}")
    low, high = tokens.min(), tokens.max()
    if low < 0 or high >= vocab:
        bad = int(low if low < 0 else high)
        raise ModelInputError(f"token id {bad} out of range [0, {vocab})")
    if position + tokens.size > max_seq_len:
        raise ModelInputError(
            f"sequence of {position + tokens.size} tokens exceeds max_seq_len {max_seq_len}"
        )
    return tokens.astype(np.int64)


def check_kv_window(kv_window: int | None, max_seq_len: int) -> None:
    """A model with full causal attention only: `kv_window` must be None (the model's own
    span) or at least `max_seq_len` (a window that never bounds anything); else a
    ModelInputError (`models.protocol.ModelProtocol.session`)."""
    if kv_window is None:
        return
    if isinstance(kv_window, bool) or not isinstance(kv_window, int | np.integer) or \
            kv_window <= 0:
        raise ModelInputError(f"kv_window must be a positive integer or None, got {kv_window!r}")
    if kv_window < max_seq_len:
        raise ModelInputError(f"kv_window={kv_window}: this model attends to its whole context "
                              f"(max_seq_len {max_seq_len}); a shorter window is not supported")
