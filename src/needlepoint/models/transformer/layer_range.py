"""Llama-family and GPT-2 models as a layer range (`models.layer_range.LayerRange`): the part
of a model a head or a stage holds (seed 003: `embed` on the head, `runLayers` on any stage,
`readout` on the head).

The part is a `TransformerModel` whose weights hold only its blocks (`load_weights(blocks=,
head=)`); `run_layers` is `runner.Runner.run_blocks`, the loop a single-process session
runs, so a split model gives the single-process bits (int8 numerics: every row computed on
its own by the same kernels; float: the same products on the same rows). The residual rows
travel between stages; the head adds learned positions (GPT-2) in `embed`, and applies the
final norm and the LM head in `readout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...formats.checkpoints import open_checkpoint
from ..layer_range import Embedded
from ..wrapping import WrapsModelText
from .kv_cache import RESERVE
from .model import TransformerModel, model_spec
from .numerics import numerics_named
from .runner import CHUNK
from .weights import load_weights


class TokensState:
    """Per sequence on the head: only the position (the tokens carry no other state here)."""

    def __init__(self, position: int = 0) -> None:
        self.position = position

    def copy(self) -> TokensState:
        return TokensState(self.position)

    def rewind_to(self, position: int) -> None:
        self.position = min(self.position, position)


class CachesState:
    """Per sequence on a stage: the KV caches of its blocks, by block index."""

    def __init__(self, caches: dict) -> None:
        self.caches = caches

    def copy(self) -> CachesState:
        return CachesState({i: c.copy() for i, c in self.caches.items()})

    def rewind_to(self, position: int) -> None:
        for cache in self.caches.values():
            cache.rewind_to(position)


class TransformerPart(WrapsModelText):
    """Blocks `blocks` of a transformer model and, with `head`, its embedding, final norm
    and LM head."""

    chunk = CHUNK  # positions per prefill chunk, as a single-process session
    has_confidence_head = False
    stacks = False  # run_layers_batch runs its chunks one after the other
    kv_windows = False  # every cache keeps what its layer's own window says

    def __init__(self, model: TransformerModel, blocks: range, head: bool) -> None:
        self.model, self.blocks, self.head = model, blocks, head
        self.runner = model.runner
        self.config, self.numerics = model.config, model.numerics
        self.exact = model.runner.numerics.exact  # LayerRange: exact numerics
        # full caches keep every position; a sliding-window cache the last window + RESERVE
        windows = any(self.config.window(i) is not None for i in range(self.config.num_layers))
        self.max_rewind = RESERVE if windows else None

    @classmethod
    def load(cls, path: Any, *, blocks: tuple[int, int] | None = None, head: bool = False,
             layers: int | None = None, numerics: str = "deploy", threads: int = 1,
             cache: bool | None = None) -> TransformerPart:
        strategy = numerics_named(numerics, threads)
        checkpoint = open_checkpoint(path)
        spec = model_spec(checkpoint, layers)
        span = range(0) if head else range(*blocks)
        weights = load_weights(checkpoint, spec, strategy, blocks=span, head=head, cache=cache)
        return cls(TransformerModel(checkpoint, spec, weights, strategy), span, head)

    def block_bytes(self) -> list[int]:
        """Every block of these architectures has the same shapes: equal shares."""
        return [1] * self.config.num_layers

    @property
    def weight_bytes(self) -> int:
        return self.model.weights.nbytes

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        return self.model.check_ids(ids, position)

    # -- the head -----------------------------------------------------------------------------
    def head_state(self) -> TokensState:
        return TokensState()

    def embed(self, state: TokensState, tokens: np.ndarray, start: int) -> Embedded:
        state.position = start + len(tokens)
        return Embedded(self.runner.embed(tokens, start))

    def readout(self, rows: np.ndarray) -> np.ndarray:
        return self.runner.readout(rows)

    # -- a stage ------------------------------------------------------------------------------
    def range_state(self, kv_window: int | None = None) -> CachesState:
        if kv_window is not None:
            raise ValueError("kv_window= is a Needle 3 option (transformer caches keep every "
                             "position)")
        return CachesState(self.runner.new_caches(self.blocks))

    def run_layers(self, first: int, end: int, x: np.ndarray, state: CachesState, start: int,
                   side: Mapping[int, Any] | None = None) -> np.ndarray:
        return self.runner.run_blocks(first, end, x, state.caches, start)

    def run_layers_batch(self, first: int, end: int, xs: Sequence[np.ndarray],
                         states: Sequence[CachesState], starts: Sequence[int],
                         sides: Sequence[Mapping[int, Any]]) -> list[np.ndarray]:
        """`run_layers` for chunks of several sequences, one after the other (each row's
        products are its own: the same bits as alone)."""
        return [self.run_layers(first, end, x, state, start)
                for x, state, start in zip(xs, states, starts, strict=True)]

    def final_rows(self, x: np.ndarray, want: str) -> np.ndarray:
        return x if want == "all" else x[-1:]

    def window_cuts(self, kv_window: int | None, position: int) -> bool:
        return False  # no kv_window is accepted (`kv_windows`)

    def confidence_rows(self, state: CachesState) -> None:
        return None  # no confidence head


__all__ = ["CachesState", "TokensState", "TransformerPart"]
