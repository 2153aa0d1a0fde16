"""Splitting a request's tokens into prefill chunks: the one helper every family's sessions,
the batch forward and the stages' head use.

A chunk of at most `size` tokens is run as one pass; which of its positions' logits are
wanted follows from what the caller wants of the whole request: every row ("all"), only the
request's last position ("last": the final chunk's last row), or none ("none").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

WANTS = ("all", "last", "none")


class Chunk(NamedTuple):
    """Tokens `first .. end-1` of a request, and the rows wanted from this chunk."""

    first: int
    end: int
    rows: str  # "all", "last" or "none"


def chunk_rows(want: str, last_chunk: bool) -> str:
    """The rows one chunk yields: all of them for "all", the last row of the final chunk for
    "last", none otherwise."""
    if want not in WANTS:
        raise ValueError(f"want must be one of {WANTS}, got {want!r}")
    if want == "all":
        return "all"
    return "last" if want == "last" and last_chunk else "none"


def chunks(count: int, size: int, want: str = "last") -> Iterator[Chunk]:
    """The chunks of a request of `count` tokens, at most `size` each, in order."""
    if size < 1:
        raise ValueError(f"chunk size must be positive, got {size}")
    for first in range(0, count, size):
        end = min(first + size, count)
        yield Chunk(first, end, chunk_rows(want, end >= count))


__all__ = ["WANTS", "Chunk", "chunk_rows", "chunks"]
