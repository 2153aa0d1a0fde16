"""Confidence-head pooling for deploy sessions, rewindable (fixture README step 7).

The head pools every cell row `C[t, r]` of the sequence with an online softmax over t
(`heads.ConfidencePool`). A deploy session keeps the cells of its most recent positions
unfolded, so `rewind(n)` can drop them, and folds them into the pool in fixed blocks of
`FOLD` positions counted from position 0 once `FOLD + max_rewind` are unfolded: which
positions are folded together depends only on the positions, never on how the sequence was
cut into prefill chunks, steps, extends and rewinds. `logit` folds the unfolded rest into a
copy. (The pool's float rounding is that of these blocks: the confidence logit agrees with a
one-pass pooling to float rounding, docs/numerics.md "What remains".)
"""

from __future__ import annotations

import numpy as np

from .heads import ConfidencePool
from .weights import ConfidenceWeights

F32 = np.float32
FOLD = 64


class PooledCells:
    """Float numerics' confidence cells: each block's rows folded into the pool as soon as
    they exist (`streaming`: the forward hands them over block by block, no [C, L+1, d]
    array). No rewind."""

    streaming = True

    def __init__(self, head: ConfidenceWeights, first: int = 0) -> None:
        self.head, self.first = head, first
        self.pool = ConfidencePool.empty(head)

    def copy(self) -> PooledCells:
        other = PooledCells.__new__(PooledCells)
        other.head, other.first, other.pool = self.head, self.first, self.pool.copy()
        return other

    def add(self, first: int, cells: np.ndarray) -> None:
        """Cells [C, R, d] of cell rows `first .. first+R-1` of the next C positions."""
        self.pool.update(self.head, cells, first)

    def folded(self) -> ConfidencePool:
        return self.pool

    def logit(self) -> float:
        return self.pool.logit(self.head)


class CellHistory:
    """The cells of rows `first .. first+rows-1` (all rows by default; a model cut into
    stages keeps each block range's rows where its blocks run). Deploy numerics' cells: the
    forward hands over all rows of a chunk at once (not `streaming`)."""

    streaming = False

    def __init__(self, head: ConfidenceWeights, max_rewind: int, first: int = 0,
                 rows: int | None = None) -> None:
        self.head = head
        self.max_rewind = max_rewind
        self.base = ConfidencePool.empty(head)
        cells, _, width = head.probes.shape
        self.first = first
        self.buffer = np.empty((FOLD + max_rewind + 1, cells if rows is None else rows, width),
                               F32)
        self.count = 0  # unfolded rows at the front of `buffer`

    def copy(self) -> CellHistory:
        other = CellHistory.__new__(CellHistory)
        other.head, other.max_rewind, other.first = self.head, self.max_rewind, self.first
        other.base = self.base.copy()
        other.buffer = self.buffer.copy()
        other.count = self.count
        return other

    def append(self, cells: np.ndarray) -> None:
        """Cells [C, L+1, d] of the next C positions."""
        done = 0
        while done < len(cells):
            room = self.buffer.shape[0] - self.count
            take = min(room, len(cells) - done)
            self.buffer[self.count : self.count + take] = cells[done : done + take]
            self.count += take
            done += take
            while self.count >= FOLD + self.max_rewind:
                self.base.update(self.head, self.buffer[:FOLD], self.first)
                self.buffer[: self.count - FOLD] = self.buffer[FOLD : self.count]
                self.count -= FOLD

    def add(self, first: int, cells: np.ndarray) -> None:
        """Cells [C, rows, d] of this history's rows (`first` is its own first row)."""
        self.append(cells)

    def rewind(self, n: int) -> None:
        if n > self.count:
            raise ValueError(f"cannot rewind {n} positions, {self.count} kept")
        self.count -= n

    def folded(self) -> ConfidencePool:
        """A copy of the pool with the unfolded rest folded in."""
        pool = self.base.copy()
        if self.count:
            pool.update(self.head, self.buffer[: self.count], self.first)
        return pool

    def logit(self) -> float:
        return self.folded().logit(self.head)
