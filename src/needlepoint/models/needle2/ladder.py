"""Needle 2 depth ladder: which blocks a k-layer rung keeps and the rung's geometry.

The Needle 2 fixtures carry no rung references, so the rule is the one the needle3 README
"Ladder" section documents for upstream's `ladder_layer_indices` (`models/ladder.py`).
"""

from __future__ import annotations

from dataclasses import replace

from ...formats.needle2_geometry import V2Config
from ..ladder import ladder_layer_indices

__all__ = ["kept_engram_sites", "ladder_config", "ladder_layer_indices"]


def ladder_config(cfg: V2Config, kept: tuple[int, ...]) -> V2Config:
    """The rung's geometry: `kept` blocks renumbered 0..k-1; engram sites at kept layers
    follow the new index, sites at dropped layers are dropped (needle3 README "Ladder")."""
    new_index = {old: new for new, old in enumerate(kept)}
    sites = tuple(new_index[site] for site in cfg.engram_sites if site in new_index)
    return replace(cfg, num_layers=len(kept), engram_sites=sites)


def kept_engram_sites(cfg: V2Config, kept: tuple[int, ...]) -> tuple[int, ...]:
    """Archive site indices (engram{s}.*) whose layer survives in the rung, in order."""
    return tuple(s for s, layer in enumerate(cfg.engram_sites) if layer in kept)
