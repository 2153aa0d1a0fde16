"""The parts of a Needle 3 model a stage or the head holds, prepared from the archive as
`models.needle3.weights.load_weights` prepares the whole model, but only for those parts.

* A stage's `StageModel` is a `V3Model` whose `weights.layers` hold its own blocks (None for
  the others) and whose step plan has their entries only: `block.run_block(model, index, ...)`
  runs on it unchanged, with the same weights, RoPE tables and plan entries as on the whole
  model. Its products are built only from its own records: in deploy numerics they are views
  of the mapped archive, so only its records' pages become resident in its process.
* The head's weights (`head_weights`) are the embedding, the engram sites, the final norm, the
  LM head and the confidence head: no block.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from types import SimpleNamespace

import numpy as np

from ..formats.cact import CactArchive
from ..formats.needle3_geometry import V3Config
from ..models import weight_cache
from ..models.needle3.exact_weights import exact_slots
from ..models.needle3.ladder import ladder_config, ladder_layer_indices
from ..models.needle3.model import NUMERICS, V3Model
from ..models.needle3.step import StepPlan, build_plan
from ..models.needle3.weights import (
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
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    if numerics == "deploy":
        return exact_slots(archive, slots, threads=threads)
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
    record = archive.record("embedding")
    table = archive.cq("embedding") if record.dtype == "cq" else archive.array("embedding")
    return V3Weights(
        embedding_table=table, lm_head=mats["lm_head"], layers=(), engram=engram,
        final_norm=_one_plus(archive, "final_norm"),
        hada_p1=archive.floats("hada_p1").astype(np.int64),
        hada_p2=archive.floats("hada_p2").astype(np.int64),
        confidence=_confidence(archive, cfg, kept),
    )


class StageModel(V3Model):
    """A `V3Model` holding only blocks `first .. end-1`: what `run_block` reads (config,
    weights.layers[index], step_plan.layers[index], hada permutations, numerics). Only a
    stage uses it; it has no embedding, LM head or engram tables (no forward of its own)."""

    def __init__(self, archive: CactArchive, config: V3Config, weights: V3Weights,
                 kept: tuple[int, ...], numerics: str, first: int, end: int) -> None:
        super().__init__(archive, config, weights, kept, numerics)
        self.first, self.end = first, end

    @classmethod
    def load(cls, archive: CactArchive, *, layers: int | None, first: int, end: int,
             numerics: str = "deploy", threads: int = 1,
             cache: bool | None = None) -> StageModel:
        kept, cfg = rung(archive, layers)
        weights = stage_weights(archive, cfg, kept, first, end, numerics, threads, cache)
        model = cls(archive, cfg, weights, kept, numerics, first, end)
        model.threads = threads
        return model

    @cached_property
    def step_plan(self) -> StepPlan:
        """`build_plan` of the whole model, restricted to this stage's blocks (its entries are
        built by the same code from the same weights; the others are None)."""
        own = self.weights.layers[self.first : self.end]
        shim = SimpleNamespace(config=self.config, weights=SimpleNamespace(layers=own),
                               rope_cos=self.rope_cos, rope_sin=self.rope_sin)
        dense = build_plan(shim)
        total = len(self.weights.layers)
        padded = (None,) * self.first + dense.layers + (None,) * (total - self.end)
        return dataclasses.replace(dense, layers=padded)

    def session(self, *args, **kwargs):  # pragma: no cover - guard
        raise TypeError("a StageModel holds part of a model; use the StagedModel")

    forward = confidence_logit = run_batch = session

    @property
    def weight_bytes(self) -> int:
        """Bytes of the products this stage reads (packed CQ rows or float matrices)."""
        total = 0
        for layer in self.weights.layers[self.first : self.end]:
            for matrix in (layer.qkvg, layer.out_proj, layer.mhc.phi):
                parts = matrix if isinstance(matrix, list) else [matrix]
                total += sum(int(getattr(p, "nbytes", 0)) for p in parts)
        return total


__all__ = ["StageModel", "head_weights", "rung", "stage_weights"]
