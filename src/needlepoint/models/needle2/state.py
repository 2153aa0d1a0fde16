"""Per-sequence decode state, allocated once (seed 002 `V2State`).

The KV cache is a ring of `cache_len` positions per layer, `[layers, KV, cache_len, hd]`:
position p lives in slot `p % cache_len`. RoPE and masking always use logical positions;
only addressing wraps (seed 000 "Logical vs physical positions"). Writing slot `p %
cache_len` evicts position `p - cache_len`, which is safe while the attention window is at
most `cache_len` (a full-causal window of 0 needs every position: `cache_len` must then
cover the whole sequence). The engram state is the token history plus the last
`(taps - 1) * dilation` un-convolved values per site (seed 002, "Deriving the Engram
window").
"""

from __future__ import annotations

import copy

import numpy as np

from ...errors import ModelInputError
from ...formats.needle2_geometry import V2Config


class V2State:
    """KV ring, token history and engram value tail of one sequence."""

    def __init__(
        self,
        cfg: V2Config,
        kv_window: int,
        cache_len: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        """`max_tokens` caps the sequence (default and at most max_seq_len); `cache_len`
        defaults to what `kv_window` needs under that cap."""
        self.cfg = cfg
        self.max_tokens = (
            cfg.max_seq_len if max_tokens is None else min(int(max_tokens), cfg.max_seq_len)
        )
        _check_window(kv_window)
        self.cache_len = (
            self.positions_needed(int(kv_window)) if cache_len is None else int(cache_len)
        )
        if self.cache_len < 1:
            raise ModelInputError(f"cache_len must be >= 1, got {cache_len!r}")
        self.kv_window = 0
        self.set_kv_window(kv_window)
        shape = (cfg.num_layers, cfg.num_kv_heads, self.cache_len, cfg.head_dim)
        self.k_cache = np.zeros(shape, np.float32)
        self.v_cache = np.zeros(shape, np.float32)
        self.history = np.zeros(cfg.max_seq_len, np.int64)
        tail = (cfg.engram_conv_taps - 1) * cfg.engram_conv_dilation
        self.engram_tail = np.zeros((len(cfg.engram_sites), tail, cfg.d_model), np.float32)
        self.position = 0

    def positions_needed(self, window: int) -> int:
        """Cached positions a window needs: itself, or the whole sequence when 0."""
        return self.max_tokens if window == 0 else min(window, self.max_tokens)

    def set_kv_window(self, window: int) -> None:
        """Attend over `window` positions (0 = full causal) from the next token on; the
        clear error of seed 002 `set_kv_window` when this cache cannot hold them."""
        _check_window(window)
        needed = self.positions_needed(int(window))
        if needed > self.cache_len:
            kind = "full causal (kv_window=0)" if window == 0 else f"kv_window={window}"
            raise ModelInputError(
                f"{kind} needs {needed} cached positions but this session's KV cache holds "
                f"{self.cache_len}; open a session with that window (model.session("
                f"kv_window={window})) so its cache is sized for it"
            )
        self.kv_window = int(window)

    def check_room(self, count: int) -> None:
        """Refuse tokens past max_seq_len (README header: the model's position limit)."""
        if self.position + count > self.max_tokens:
            limit = (
                f"max_seq_len {self.cfg.max_seq_len}"
                if self.max_tokens == self.cfg.max_seq_len
                else f"this session's limit of {self.max_tokens}"
            )
            raise ModelInputError(
                f"sequence would reach {self.position + count} tokens, over {limit} "
                f"(at position {self.position}, adding {count})"
            )

    def copy(self) -> V2State:
        """An independent deep copy (the geometry is shared, being frozen)."""
        other = copy.copy(self)
        for name in ("k_cache", "v_cache", "history", "engram_tail"):
            setattr(other, name, getattr(self, name).copy())
        return other

    def reset(self) -> None:
        """Start a new sequence, keeping the allocations."""
        self.position = 0
        self.k_cache.fill(0.0)
        self.v_cache.fill(0.0)
        self.history.fill(0)
        self.engram_tail.fill(0.0)


def _check_window(window: object) -> None:
    if isinstance(window, bool) or not isinstance(window, int | np.integer) or window < 0:
        raise ModelInputError(f"kv_window must be an int >= 0, got {window!r}")
