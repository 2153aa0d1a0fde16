"""Engram state of a deploy session by position, so a rewind can go back (README step 2).

A chunk needs the last `max(order) - 1` tokens (from the session's tokens) and each site's
last `(taps - 1) * dilation` raw value projections before it (`engram.EngramTail`). This keeps
each site's value projections of recent positions in a ring (position p in row p % len), with
`max_rewind` rows to spare, and builds the tail for any recent position.
"""

from __future__ import annotations

import numpy as np

from ...formats.needle3_geometry import V3Config
from .engram import EngramChunk, EngramTail

F32 = np.float32


class EngramCarry:
    """Float numerics' engram state: the tail of the last chunk, carried to the next (no
    rewind; the one-token step advances it in place)."""

    def __init__(self, carried: EngramTail) -> None:
        self.carried = carried

    def copy(self) -> EngramCarry:
        return EngramCarry(self.carried.copy())

    def tail(self, tokens: np.ndarray) -> EngramTail:
        """The tail before the next chunk (`tokens`: every token consumed so far)."""
        return self.carried

    def record_chunk(self, chunk: EngramChunk, start: int) -> None:
        """Take the tail a chunk leaves (its values are complete once every site ran)."""
        self.carried = chunk.tail


class EngramHistory:
    """Deploy numerics' engram state by position (module doc)."""

    def __init__(self, cfg: V3Config, sites: int, max_rewind: int) -> None:
        self.reach = max(0, cfg.engram_conv_taps - 1) * cfg.engram_conv_dilation
        self.keep_tokens = max(cfg.engram_orders, default=1) - 1
        rows = self.reach + max_rewind if self.reach else 0
        self.values = np.zeros((sites, rows, cfg.d_model), F32)

    def copy(self) -> EngramHistory:
        other = EngramHistory.__new__(EngramHistory)
        other.reach, other.keep_tokens = self.reach, self.keep_tokens
        other.values = self.values.copy()
        return other

    def tail(self, tokens: np.ndarray) -> EngramTail:
        """The tail before position len(tokens) (`tokens`: every token consumed so far)."""
        position = len(tokens)
        keep = tokens[max(0, position - self.keep_tokens) :] if self.keep_tokens else tokens[:0]
        wanted = np.arange(position - self.reach, position)
        if self.reach:
            values = self.values[:, wanted % self.values.shape[1]]
            values[:, wanted < 0] = 0.0
        else:
            values = self.values[:, :0]
        return EngramTail(np.asarray(keep, np.int64).copy(), values)

    def record_chunk(self, chunk: EngramChunk, start: int) -> None:
        """Keep the value projections of every site a chunk at `start` computed."""
        for site, raw in chunk.raw_values.items():
            self.record(site, start, raw)

    def record(self, site: int, start: int, raw: np.ndarray) -> None:
        """Value projections [C, d] of positions start .. start+C-1 at `site`."""
        if not self.reach:
            return
        rows = self.values.shape[1]
        keep = min(len(raw), rows)
        positions = np.arange(start + len(raw) - keep, start + len(raw))
        self.values[site, positions % rows] = raw[len(raw) - keep :]
