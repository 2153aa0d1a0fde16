"""Depth ladder: which blocks a k-layer rung keeps (fixture README "Ladder").

Upstream's rung of depth k keeps `ladder_layer_indices(L, k)`: start with {0, L-1}, then
repeatedly add the midpoint `(left + right) // 2` of the widest gap (leftmost on ties). Kept
blocks keep their weights and are renumbered 0..k-1, so mHC lane one-hots, global layers and
engram sites follow the new index.
"""

from __future__ import annotations

import dataclasses

from ..errors import ModelInputError
from .config import V3Config


def ladder_layer_indices(num_layers: int, depth: int) -> tuple[int, ...]:
    """Block indices (of the full model, ascending) kept by the `depth`-layer rung."""
    if depth == num_layers:
        return tuple(range(num_layers))
    if not 2 <= depth <= num_layers:  # upstream: every rung keeps both endpoint blocks
        raise ModelInputError(f"layers={depth}: a rung needs 2..{num_layers} layers")
    kept = {0, num_layers - 1}
    while len(kept) < depth:
        ordered = sorted(kept)
        pairs = zip(ordered, ordered[1:], strict=False)
        gaps = [(right - left, left, right) for left, right in pairs]
        widest = max(width for width, _, _ in gaps)
        left, right = next((lo, hi) for width, lo, hi in gaps if width == widest)
        if right - left < 2:  # pragma: no cover - depth <= num_layers rules this out
            break
        kept.add((left + right) // 2)
    return tuple(sorted(kept))


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
