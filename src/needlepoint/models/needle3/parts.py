"""The parts of a Needle 3 model a stage or the head holds (`layer_range.V3Part`), prepared
from the archive as `weights.load_weights` prepares the whole model, but only for those parts.

* A block range's weights (`stage_weights`): `weights.layers` hold its own blocks (None for
  the others). Its products are built only from its own records: in deploy numerics they are
  views of the mapped archive, so only its records' pages become resident in its process.
* The head's weights (`head_weights`) are the embedding, the engram sites, the final norm, the
  LM head and the confidence head: no block.
* `layer_bytes`: the archive bytes each block reads (what a plan balances).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...formats.cact import CactArchive
from ...formats.needle3_geometry import V3Config
from .. import weight_cache
from .ladder import ladder_config, ladder_layer_indices
from .numerics import numerics as make_numerics
from .weights import (
    EngramSite,
    Filler,
    Slot,
    V3Weights,
    _confidence,
    _kept_sites,
    _layer,
    _one_plus,
    plan,
)


def rung(archive: CactArchive, layers: int | None) -> tuple[tuple[int, ...], V3Config]:
    """The kept block indices and geometry of the `layers`-deep rung (None: every block)."""
    full = archive.config
    depth = full.num_layers if layers is None else int(layers)
    kept = ladder_layer_indices(full.num_layers, depth)
    return kept, ladder_config(full, kept)


def _products(archive: CactArchive, slots: list[Slot], numerics: str, threads: int,
              cache: bool | None) -> dict:
    products = make_numerics(numerics, threads).products()
    if products is not None:
        return products(archive, slots)
    mats = weight_cache.arena(archive, slots, Filler(archive), cache)
    archive.release(sorted({name for slot in slots for name, _, _ in slot.parts}))
    return mats


def _block_of(slot: Slot) -> int | None:
    head, _, _ = slot.key.partition(".")
    return int(head) if head.isdigit() else None


def _site_map(archive: CactArchive, kept: tuple[int, ...]) -> dict[int, int]:
    """{full block index: engram site index among the kept sites} (as `load_weights`)."""
    full = archive.config
    return {full.engram_sites[s]: i for i, s in enumerate(_kept_sites(archive, kept))}


def stage_weights(
    archive: CactArchive, cfg: V3Config, kept: tuple[int, ...], first: int, end: int,
    numerics: str, threads: int = 1, cache: bool | None = None,
) -> V3Weights:
    """Weights of blocks `first .. end-1` of the rung keeping `kept` (the other entries of
    `layers` are None), with the confidence head (its pool rows of these blocks)."""
    slots = [s for s in plan(archive, cfg, kept)
             if (b := _block_of(s)) is not None and first <= b < end]
    mats = _products(archive, slots, numerics, threads, cache)
    sites = _site_map(archive, kept)
    layers: list = [None] * len(kept)
    for new in range(first, end):
        layers[new] = _layer(archive, cfg, kept[new], new, mats, sites)
    return V3Weights(
        embedding_table=None, lm_head=None, layers=tuple(layers), engram=(),
        final_norm=None,
        hada_p1=archive.floats("hada_p1").astype(np.int64),
        hada_p2=archive.floats("hada_p2").astype(np.int64),
        confidence=_confidence(archive, cfg, kept),
    )


def head_weights(
    archive: CactArchive, cfg: V3Config, kept: tuple[int, ...], numerics: str,
    threads: int = 1, cache: bool | None = None,
) -> V3Weights:
    """The head's weights: embedding, engram sites, final norm, LM head, confidence head."""
    slots = [s for s in plan(archive, cfg, kept) if _block_of(s) is None]
    mats = _products(archive, slots, numerics, threads, cache)
    engram = tuple(
        EngramSite(
            tables=archive.cq(f"engram{s}.tables"),
            key_value=mats[f"engram{s}.key_value"],
            taps=archive.floats(f"engram{s}.taps"),
        )
        for s in _kept_sites(archive, kept)
    )
    return V3Weights(
        embedding_table=archive.table("embedding"), embedding_type=archive.wtype("embedding"),
        lm_head=mats["lm_head"], layers=(), engram=engram,
        final_norm=_one_plus(archive, "final_norm"),
        hada_p1=archive.floats("hada_p1").astype(np.int64),
        hada_p2=archive.floats("hada_p2").astype(np.int64),
        confidence=_confidence(archive, cfg, kept),
    )


# archive records shared by all blocks, one row range per block (README "The `.cact` archive")
SHARED_PER_LAYER = ("mhc_phi_pre", "mhc_phi_post", "mhc_phi_res", "mhc_a_pre", "mhc_a_post",
                    "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res")


def layer_bytes(archive: CactArchive, kept: Sequence[int]) -> list[int]:
    """Archive bytes each kept block reads: its `layerNN.*` records and its share of the
    per-block rows of the shared mHC records."""
    full = archive.config.num_layers
    shared = sum(archive.record(name).nbytes for name in SHARED_PER_LAYER if archive.has(name))
    totals = []
    for old in kept:
        prefix = f"layer{old:02d}."
        own = sum(r.nbytes for r in archive.records if r.name.startswith(prefix))
        totals.append(own + shared // full)
    return totals


__all__ = ["head_weights", "layer_bytes", "rung", "stage_weights"]
