"""Depth ladder: which blocks a k-layer rung keeps (fixture README "Ladder").

Upstream's rung of depth k keeps `ladder_layer_indices(L, k)`: start with {0, L-1}, then
repeatedly add the midpoint `(left + right) // 2` of the widest gap (leftmost on ties). Kept
blocks keep their weights and are renumbered 0..k-1, so mHC lane one-hots, global layers and
engram sites follow the new index.
"""

from __future__ import annotations

import dataclasses

from ...formats.needle3_geometry import V3Config
from ..ladder import ladder_layer_indices

__all__ = ["ladder_config", "ladder_layer_indices"]


def ladder_config(cfg: V3Config, kept: tuple[int, ...]) -> V3Config:
    """The geometry of the rung keeping blocks `kept`: renumbered layers, global layers and
    engram sites (sites on dropped blocks disappear)."""
    new_index = {old: new for new, old in enumerate(kept)}
    return dataclasses.replace(
        cfg,
        num_layers=len(kept),
        global_layers=tuple(new_index[g] for g in cfg.global_layers if g in new_index),
        engram_sites=tuple(new_index[s] for s in cfg.engram_sites if s in new_index),
    )
