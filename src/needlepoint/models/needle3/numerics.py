"""Needle 3's two numerics as strategy objects, picked once when a model is loaded
(docs/numerics.md): everything that differs between float and deploy numerics is a
method or attribute here, so no operation takes a `quantized` flag.

* `NeedleFloat`: the stored weights dequantised to float32 and multiplied by BLAS, numpy's
  exp, numpy's batched lane sums, a float32 KV cache (`cache.LayerCache`), the float RoPE
  tables.
* `NeedleDeploy`: exact CQ x A8 products (`kernels.exact`), the pinned exp, sigmoid,
  softmax and MLP products, lane sums in lane order, an int8 KV cache
  (`exact_attention.Int8LayerCache`), the float64-rounded RoPE tables, and the native step
  (`native_block.NativePlan`) when the library is loaded. Every row is computed on its own,
  so the bits do not depend on the batch or the chunking, and a session can rewind exactly.

What does not differ is not here: both take the one Sinkhorn (`ops.sinkhorn`, pinned exp)
and the norms (`ops.rms_unit`, `norms.zc_norm`).

`numerics(name, threads)` is the one place a numerics name becomes one of these.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ...formats.needle3_geometry import V3Config
from ...kernels import native, pinned
from ...kernels.exact import a8_product
from ..numerics import NEEDLE_NUMERICS as NUMERICS
from ..ops import rope_tables, rope_tables_pinned, sigmoid
from .attention import attention_parts, attention_stacked
from .cache import LayerCache
from .cell_history import CellHistory, PooledCells
from .engram import new_tail
from .engram_history import EngramCarry, EngramHistory
from .exact_attention import MAX_REWIND, Int8LayerCache
from .exact_weights import exact_slots
from .lanes import lane_mean, lane_sum, matmul_lane_sum, mean_cells, mix_lanes, scatter
from .mlp import hadamard_mlp, hadamard_mlp_pinned
from .native_block import NativePlan, supported
from .weights import ConfidenceWeights, rotate

F32 = np.float32


class NeedleFloat:
    """Float numerics (module doc)."""

    name = "float"
    exact = False  # rows depend on the batch (BLAS); a rewind re-runs the kept tokens
    stacks = False  # several sequences' chunks run one by one, not stacked
    max_rewind: int | None = None
    cache_type = LayerCache
    rope_tables = staticmethod(rope_tables)
    product = staticmethod(np.matmul)
    sigmoid = staticmethod(sigmoid)
    lane_sum = staticmethod(matmul_lane_sum)
    mix_lanes = staticmethod(scatter)  # in place on the lanes
    attention = staticmethod(attention_parts)
    hadamard_mlp = staticmethod(hadamard_mlp)

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads

    @staticmethod
    def cell_row(lanes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The lane mean after a block (a confidence cell) [C, d]."""
        return mean_cells(lanes, out)

    @staticmethod
    def final_mean(lanes: np.ndarray) -> np.ndarray:
        """The lane mean the final norm reads."""
        return lanes.mean(axis=1)

    @staticmethod
    def lm_head(hidden: np.ndarray, lm_head: np.ndarray) -> np.ndarray:
        """Logits of final hidden rows: the LM head is kept in the rotated domain (weights.py)."""
        return rotate(hidden) @ lm_head

    @staticmethod
    def engram_state(cfg: V3Config, sites: int) -> EngramCarry:
        """A sequence's engram state: the tail carried from chunk to chunk."""
        return EngramCarry(new_tail(cfg, sites))

    @staticmethod
    def cell_state(head: ConfidenceWeights | None, first: int = 0,
                   rows: int | None = None) -> PooledCells | None:
        """A sequence's confidence cells: folded into the pool as they come."""
        return None if head is None else PooledCells(head, first)

    def native_plan(self, model: Any) -> None:
        """Float numerics have no native step."""
        return None

    def products(self) -> None:
        """The weight products are the float32 arena (`weights.load_weights`' default)."""
        return None


class NeedleDeploy:
    """Deploy numerics (module doc). Holds the model's native plan once built."""

    name = "deploy"
    exact = True  # same bits for any batch, chunking, split; rewind exact
    stacks = True  # several sequences' chunks run as one stacked pass
    max_rewind: int | None = MAX_REWIND
    cache_type = Int8LayerCache
    rope_tables = staticmethod(rope_tables_pinned)
    product = staticmethod(a8_product)
    sigmoid = staticmethod(pinned.sigmoid)
    lane_sum = staticmethod(lane_sum)
    mix_lanes = staticmethod(mix_lanes)  # a new array; the input lanes are kept
    attention = staticmethod(attention_stacked)
    hadamard_mlp = staticmethod(hadamard_mlp_pinned)
    lm_head = staticmethod(a8_product)  # the exact A8 product with the tied embedding rows

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self._plan: NativePlan | None = None
        self._planned = False  # whether `_plan` was decided (None: the model is unsupported)

    @staticmethod
    def cell_row(lanes: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The lane mean after a block, in lane order [C, d]."""
        if out is None:
            return lane_mean(lanes)
        out[...] = lane_mean(lanes)
        return out

    final_mean = staticmethod(lane_mean)

    @staticmethod
    def engram_state(cfg: V3Config, sites: int) -> EngramHistory:
        """A sequence's engram state by position, so a rewind can go back."""
        return EngramHistory(cfg, sites, MAX_REWIND)

    @staticmethod
    def cell_state(head: ConfidenceWeights | None, first: int = 0,
                   rows: int | None = None) -> CellHistory | None:
        """A sequence's confidence cells, the recent ones unfolded so a rewind can drop them."""
        return None if head is None else CellHistory(head, MAX_REWIND, first, rows)

    def products(self) -> Callable:
        """How the weight products are built: packed CQ rows of the archive
        (`exact_weights.exact_slots`, for `weights.load_weights`)."""
        return partial(exact_slots, threads=self.threads)

    def native_plan(self, model: Any) -> NativePlan | None:
        """The model's weights as the native step's structs (built on first use), or None
        when the library is not loaded or the geometry is one the C code does not take."""
        if native.library() is None:
            return None
        if not self._planned:
            supports = supported(model.config, model.weights)
            self._plan = NativePlan(model.config, model.weights, model.step_plan,
                                    self.threads) if supports else None
            self._planned = True
        return self._plan


Numerics = NeedleFloat | NeedleDeploy
KINDS: dict[str, Callable[[int], Numerics]] = {"float": NeedleFloat, "deploy": NeedleDeploy}


def numerics(name: str, threads: int = 1) -> Numerics:
    """The numerics object of `name` ("deploy" or "float"); a ValueError names the choices."""
    if name not in KINDS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {name!r}")
    return KINDS[name](threads)


__all__ = ["NUMERICS", "NeedleDeploy", "NeedleFloat", "Numerics", "numerics"]
