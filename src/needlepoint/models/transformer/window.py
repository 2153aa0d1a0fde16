"""KV caches of sliding-window layers (Gemma 3's `sliding_attention`, Qwen's
`use_sliding_window`): a query at position p sees keys p - window < j <= p
(`shared/fixtures/hf/README.md`, second part, Gemma 3 step 3).

Such a layer never reads a key more than `window - 1` positions back, so its cache keeps only
the last `window - 1 + RESERVE` positions between calls (bounded memory however long the
conversation); a chunk's own keys join them for its attention. `RESERVE` extra positions are
kept so that a short rewind (a rejected speculative draft) is exact in place; a longer one is
refused by `can_rewind_to` and the session replays its tokens instead (`session.py`).
Float: `attention.causal_attention` with the window mask. int8: the keys are A16 and the values
A8 rows as in `int8.Int8KVCache`, and each query row attends its window in ascending position order
through `kernels.pinned.attend` (`attend_reference`'s definition, the same as the full
layers' causal kernel), so a position's bits do not depend on the chunking.
"""

from __future__ import annotations

import numpy as np

from ...kernels import exact, pinned
from .attention import causal_attention
from .int8 import query_codes

F32 = np.float32
RESERVE = 32  # positions kept beyond the window, for exact short rewinds


class _Window:
    """Rows of positions `base .. length - 1` along axis `axis` of each array in `NAMES`."""

    NAMES: tuple[str, ...] = ()
    AXIS = 0

    def __init__(self, window: int, arrays: dict[str, np.ndarray]) -> None:
        self.window = window
        self.base = 0
        self.length = 0
        for name, array in arrays.items():
            setattr(self, name, array)

    def _joined(self, new: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.concatenate([getattr(self, name), new[name]], axis=self.AXIS)
                for name in self.NAMES}

    def _keep(self, joined: dict[str, np.ndarray], end: int) -> None:
        """Store `joined` (positions base..end-1), trimmed to the rows a later call can need."""
        first = max(self.base, end - (self.window - 1 + RESERVE))
        cut = first - self.base
        for name, array in joined.items():
            index = [slice(None)] * array.ndim
            index[self.AXIS] = slice(cut, None)
            setattr(self, name, np.ascontiguousarray(array[tuple(index)]))
        self.base, self.length = first, end

    def can_rewind_to(self, position: int) -> bool:
        """Whether every key a query at `position` will read is still held."""
        return position >= self.length or self.base <= max(0, position - self.window + 1)

    def rewind_to(self, position: int) -> None:
        """Forget positions >= `position` (exact; ValueError past what the cache holds)."""
        if position >= self.length:
            return
        if not self.can_rewind_to(position):
            raise ValueError(f"a sliding-window cache holds positions {self.base}.. only: it "
                             f"cannot rewind to {position}")
        keep = position - self.base
        for name in self.NAMES:
            array = getattr(self, name)
            index = [slice(None)] * array.ndim
            index[self.AXIS] = slice(0, keep)
            setattr(self, name, array[tuple(index)].copy())
        self.length = position

    def copy(self) -> _Window:
        other = type(self).__new__(type(self))
        other.window, other.base, other.length = self.window, self.base, self.length
        for name in self.NAMES:
            setattr(other, name, getattr(self, name).copy())
        return other

    def _check(self, start: int) -> None:
        if start != self.length:
            raise ValueError(f"cache holds {self.length} positions, the chunk starts at {start}")


class WindowKVCache(_Window):
    """Float keys and values `[kv_heads, positions, head_dim]` of a sliding-window layer."""

    NAMES = ("keys", "values")
    AXIS = 1

    def __init__(self, kv_heads: int, head_dim: int, window: int) -> None:
        empty = np.zeros((kv_heads, 0, head_dim), F32)
        super().__init__(window, {"keys": empty, "values": empty.copy()})

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int,
               scale: float, softcap: float | None = None) -> np.ndarray:
        """Append k, v [T, Hkv, hd]; q [T, H, hd] at positions start.. -> [T, H*hd]."""
        self._check(start)
        joined = self._joined({"keys": k.transpose(1, 0, 2), "values": v.transpose(1, 0, 2)})
        out = causal_attention(q, joined["keys"], joined["values"], start, scale,
                               base=self.base, window=self.window, softcap=softcap)
        self._keep(joined, start + q.shape[0])
        return out


class Int8WindowCache(_Window):
    """int16 keys and int8 values `[positions, kv_heads, head_dim]` (scales
    `[positions, kv_heads]`) of a sliding-window layer."""

    NAMES = ("kcode", "kscale", "vcode", "vscale")

    def __init__(self, kv_heads: int, head_dim: int, window: int) -> None:
        scales = np.zeros((0, kv_heads), F32)
        super().__init__(window, {"kcode": np.zeros((0, kv_heads, head_dim), np.int16),
                                  "kscale": scales,
                                  "vcode": np.zeros((0, kv_heads, head_dim), np.int8),
                                  "vscale": scales.copy()})

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int,
               scale: float, softcap: float | None = None) -> np.ndarray:
        """Append k (A16), v (A8) per row of head_dim; q [T, H, hd] at positions start.. attends
        its window -> [T, H*hd]. Query scale and `softcap` as `Int8KVCache.attend`."""
        self._check(start)
        count, heads, head_dim = q.shape
        kv_heads = k.shape[1]
        new = {}
        for name, src, rule in (("k", k, exact.a16_codes), ("v", v, exact.a8_codes)):
            c, s = rule(np.ascontiguousarray(src, F32).reshape(count * kv_heads, head_dim))
            new[name + "code"] = c.reshape(count, kv_heads, head_dim)
            new[name + "scale"] = s.reshape(count, kv_heads)
        joined = self._joined(new)
        qcode, qscale = query_codes(q, scale)
        slots, seen = window_slots(start, count, heads, kv_heads, self.base, self.window)
        held = joined["kcode"].shape[0] * kv_heads
        arrays = (qcode, qscale, joined["kcode"].reshape(held, head_dim),
                  joined["kscale"].reshape(held), joined["vcode"].reshape(held, head_dim),
                  joined["vscale"].reshape(held), slots, seen)
        out = (pinned.attend(*arrays) if softcap is None
               else pinned.attend_reference(*arrays, softcap=softcap))
        self._keep(joined, start + count)
        return out.reshape(count, heads * head_dim)


def window_slots(start: int, count: int, heads: int, kv_heads: int, base: int, window: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """slots [count*heads, n] and keys seen per query row (t, h): rows `(j - base) * kv_heads
    + g` of positions j = max(0, p - window + 1) .. p, p = start + t, ascending, of kv head
    g = h // (heads / kv_heads)."""
    positions = np.arange(start, start + count, dtype=np.int64)
    first = np.maximum(positions - window + 1, 0)
    seen = positions - first + 1  # [count]
    longest = int(seen.max())
    offsets = np.minimum(first[:, None] + np.arange(longest)[None, :], positions[:, None])
    g = np.arange(heads, dtype=np.int64) // (heads // kv_heads)
    slots = (offsets - base)[:, None, :] * kv_heads + g[None, :, None]  # [count, heads, n]
    return slots.reshape(count * heads, longest), np.repeat(seen, heads)


__all__ = ["RESERVE", "Int8WindowCache", "WindowKVCache", "window_slots"]
