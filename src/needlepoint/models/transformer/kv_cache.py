"""How a layer's KV cache holds positions: one storage rule for every cache (float and int8),
the sliding window as a policy.

A cache holds rows of positions `base .. length - 1` along one axis of each of its arrays
(`KVRows.NAMES`), in buffers that grow by doubling up to a limit (a model's `max_seq_len` can be
far larger than any one conversation): `grow`, the one growth rule. What a layer's attention
may still read decides what is kept, and that is the policy:

* `Full`: every position (`base` stays 0); a rewind only moves `length`.
* `Window` (Gemma 3's `sliding_attention`, Qwen's `use_sliding_window`): a query at position p
  sees keys p - window < j <= p (`shared/fixtures/hf/README.md`, second part, Gemma 3 step 3),
  so between calls only the last `window - 1 + RESERVE` positions are kept (bounded memory
  however long the conversation). `RESERVE` extra positions make a short rewind (a rejected
  speculative draft) exact in place; a longer one is refused by `can_rewind_to` and the session
  replays its tokens instead (`session.py`).

The storage classes are `attention.KVCache` (float32 keys and values) and `int8.Int8KVCache`
(int16 keys, int8 values and their scales); each takes its policy from the layer's window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

RESERVE = 32  # positions kept beyond the window, for exact short rewinds
MIN_CAPACITY = 64


class Full:
    """Keep every position."""

    window = None

    def first_kept(self, base: int, end: int) -> int:
        return base

    def can_rewind_to(self, base: int, length: int, position: int) -> bool:
        return True


class Window:
    """Keep the last `window - 1 + RESERVE` positions (module doc)."""

    def __init__(self, window: int) -> None:
        self.window = window

    def first_kept(self, base: int, end: int) -> int:
        return max(base, end - (self.window - 1 + RESERVE))

    def can_rewind_to(self, base: int, length: int, position: int) -> bool:
        """Whether every key a query at `position` will read is still held."""
        return position >= length or base <= max(0, position - self.window + 1)


def policy(window: int | None) -> Full | Window:
    return Full() if window is None else Window(window)


def grow(array: np.ndarray, axis: int, held: int, rows: int, limit: int | None) -> np.ndarray:
    """`array` with room for `rows` rows along `axis` (doubling, at least MIN_CAPACITY, at most
    `limit` unless `rows` needs more), its first `held` rows kept; itself when it has room."""
    capacity = array.shape[axis]
    if rows <= capacity:
        return array
    wanted = max(MIN_CAPACITY, 2 * capacity, rows)
    capacity = max(min(limit, wanted) if limit is not None else wanted, rows)
    shape = list(array.shape)
    shape[axis] = capacity
    grown = np.zeros(shape, array.dtype)
    index = _rows(array.ndim, axis, 0, held)
    grown[index] = array[index]
    return grown


def _rows(ndim: int, axis: int, first: int, end: int | None) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    index[axis] = slice(first, end)
    return tuple(index)


class KVRows:
    """Rows of positions `base .. length - 1` along `AXIS` of each array in `NAMES`, kept as
    the policy says (module doc)."""

    NAMES: tuple[str, ...] = ()
    AXIS = 0
    __slots__ = ("base", "length", "limit", "policy")

    def _setup(self, arrays: dict[str, np.ndarray], limit: int, window: int | None) -> None:
        for name, array in arrays.items():
            setattr(self, name, array)
        self.base, self.length = 0, 0
        self.policy = policy(window)
        self.limit = limit if window is None else None

    @property
    def window(self) -> int | None:
        return self.policy.window

    def reserve(self, end: int) -> None:
        """Room for positions up to `end`."""
        for name in self.NAMES:
            setattr(self, name, grow(getattr(self, name), self.AXIS, self.length - self.base,
                                     end - self.base, self.limit))

    def held(self, name: str) -> np.ndarray:
        """A view of the rows of positions `base .. length - 1` of array `name`."""
        array = getattr(self, name)
        return array[_rows(array.ndim, self.AXIS, 0, self.length - self.base)]

    def write(self, new: dict[str, np.ndarray]) -> None:
        """Store the next positions' rows (each of `new` holds them along `AXIS`)."""
        count = next(iter(new.values())).shape[self.AXIS]
        end = self.length + count
        self.reserve(end)
        for name, rows in new.items():
            array = getattr(self, name)
            array[_rows(array.ndim, self.AXIS, self.length - self.base, end - self.base)] = rows
        self.length = end

    def trim(self) -> None:
        """Drop the rows the policy no longer keeps (moved to the front of the buffers)."""
        first = self.policy.first_kept(self.base, self.length)
        cut, held = first - self.base, self.length - self.base
        if cut <= 0:
            return
        for name in self.NAMES:
            array = getattr(self, name)
            ndim = array.ndim
            array[_rows(ndim, self.AXIS, 0, held - cut)] = \
                array[_rows(ndim, self.AXIS, cut, held)].copy()
        self.base = first

    def check_start(self, start: int) -> None:
        if start != self.length:
            raise ValueError(f"cache holds {self.length} positions, the chunk starts at {start}")

    def can_rewind_to(self, position: int) -> bool:
        return self.policy.can_rewind_to(self.base, self.length, position)

    def rewind_to(self, position: int) -> None:
        """Forget positions >= `position` (exact: they are overwritten before being read;
        ValueError past what a window cache holds)."""
        if position >= self.length:
            return
        if not self.can_rewind_to(position):
            raise ValueError(f"a sliding-window cache holds positions {self.base}.. only: it "
                             f"cannot rewind to {position}")
        self.length = position

    def copy_rows(self, other: Any) -> Any:
        """`other` (a bare instance of this class) made an independent copy of this cache."""
        for name in self.NAMES:
            array = getattr(self, name)
            keep = max(self.length - self.base, 1)
            setattr(other, name, array[_rows(array.ndim, self.AXIS, 0, keep)].copy())
        other.base, other.length, other.limit, other.policy = (
            self.base, self.length, self.limit, self.policy)
        return other
