"""The layer-range interface every model family offers (seed 003, "DaisyChain": `embed` on
the head, `runLayers` on any stage, `readout` on the head).

A model cut at block boundaries is a head and stages. The head keeps, per sequence, what
depends on the tokens alone (`head_state`: the tokens, and for Needle 3 the engram history
and confidence row 0); `embed` turns a chunk of tokens into the first block's input plus the
side inputs some blocks need from the head (Needle 3: each engram site's key and tapped
value, keyed by the block that reads them). A stage holds a contiguous block range and, per
sequence, that range's own caches (`range_state`); `run_layers` runs the range over one
chunk. The last stage reduces its output to the rows the head reads out (`final_rows`:
Needle 3's lane means, a transformer's residual rows), and `readout` applies the final norm
and the LM head. Every product goes through the family's own kernels (in exact numerics the
verified int8 / A8 units), so a model cut anywhere gives the single-process bits.

`models.parts.load_part(path, blocks=..., head=...)` loads the part of a model a head or a
stage holds (only those weights); `needlepoint.stages` uses nothing else of `models/`. How a
request is cut into prefill chunks is part of this interface: the head splits it with the
one splitter every family's sessions use (`chunks`, from `models.chunking`), so a staged
model runs the chunks a single process runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .chunking import Chunk, chunk_rows, chunks


@dataclass
class Embedded:
    """The head's work for one chunk: the first block's input rows and the side inputs."""

    x: np.ndarray  # [C, d]
    side: dict[int, tuple[np.ndarray, ...]] = field(default_factory=dict)  # block -> arrays


@runtime_checkable
class SequenceState(Protocol):
    """Per-sequence state of a head or a block range (caches, histories)."""

    def copy(self) -> SequenceState: ...

    def rewind_to(self, position: int) -> None:
        """Forget positions >= `position` (exact numerics; see `LayerRange.max_rewind`)."""


@runtime_checkable
class LayerRange(Protocol):
    """A model (or the part of one a head or a stage holds) seen as a range of blocks."""

    config: Any  # the family's geometry (`vocab`, `max_seq_len`, `num_layers`, ...)
    numerics: str
    exact: bool  # exact numerics: same bits for any chunking, split, batch; rewind exact
    blocks: range  # the blocks whose weights this part holds
    max_rewind: int | None  # positions a rewind may undo (None: any)
    stacks: bool  # run_layers_batch stacks a micro-batch in one pass (else one by one)
    kv_windows: bool  # `range_state(kv_window=)` bounds the attention caches

    @property
    def has_confidence_head(self) -> bool: ...

    def window_cuts(self, kv_window: int | None, position: int) -> bool:
        """Whether `kv_window` has cut some block's attention by `position` (False where
        `kv_windows` is False)."""

    def confidence_rows(self, state: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(peak, total, pooled) of this part's confidence rows (None without the head)."""

    def check_ids(self, ids: Any, position: int = 0) -> np.ndarray: ...

    # -- the head ---------------------------------------------------------------------------
    def head_state(self) -> SequenceState: ...

    def embed(self, state: Any, tokens: np.ndarray, start: int) -> Embedded:
        """The chunk `tokens` at positions `start ..` (advances `state`)."""

    def readout(self, rows: np.ndarray) -> np.ndarray:
        """Logits [R, vocab] of `final_rows` output: final norm, then the LM head."""

    # -- a stage ----------------------------------------------------------------------------
    def range_state(self, kv_window: int | None = None) -> SequenceState:
        """Fresh caches of this part's blocks for one sequence."""

    def run_layers(self, first: int, end: int, x: np.ndarray, state: Any, start: int,
                   side: Mapping[int, tuple[np.ndarray, ...]] | None = None) -> np.ndarray:
        """Blocks `first .. end-1` over one chunk at positions `start ..`: `x` is the
        embedding rows when `first == 0`, else the previous block's output; `state` holds
        the blocks' caches (advanced in place)."""

    def run_layers_batch(self, first: int, end: int, xs: Sequence[np.ndarray],
                         states: Sequence[Any], starts: Sequence[int],
                         sides: Sequence[Mapping[int, tuple[np.ndarray, ...]]]
                         ) -> list[np.ndarray]:
        """`run_layers` for one chunk of each of several sequences (a micro-batch): each
        output is the same bits as that chunk run alone (exact numerics)."""

    def final_rows(self, x: np.ndarray, want: str) -> np.ndarray:
        """The last block's output reduced to the rows the head reads out ("all" / "last")."""


__all__ = ["Chunk", "Embedded", "LayerRange", "SequenceState", "chunk_rows", "chunks"]
