"""A Needle 3 model cut at block boundaries into stages: `load_staged` and `StagedModel`.

The head (this object) holds the tokenizer, the embedding, the engram sites, the final norm,
the LM head and the confidence head; each stage (`stage.Stage`, on the chosen transport)
holds its contiguous range of blocks. The public interface is the single-process model's
(`V3Model`): `forward`, `session`, `confidence_logit`, `check_ids`, `run_batch`, `tokenizer`,
`config`, `has_confidence_head`, so `Needle`, the CLI and the server take it unchanged. In
deploy numerics its logits are the single-process logits bit for bit, for every split.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import StagePlanError
from ..formats.cact import open_archive
from ..formats.checkpoints import is_checkpoint
from ..models.loader import resolve_threads
from ..models.needle3.model import NUMERICS, V3Model
from ..models.needle3.session import CHUNK
from .parts import head_weights, rung
from .plan import StagePlan, plan_stages
from .session import StagedSession
from .stage import StageSpec

TRANSPORTS = ("local", "ray")


class StagedModel:
    """A Needle 3 model whose blocks run on stages. Use `needlepoint.load(path, stages=...)`."""

    def __init__(self, archive, config, weights, layer_indices, numerics: str,
                 plan: StagePlan, transport) -> None:
        self.archive = archive
        self.path = archive.path
        self.config = config
        self.weights = weights
        self.layer_indices = layer_indices
        self.numerics = numerics
        self.quantized = numerics == "deploy"
        self.plan = plan
        self.transport = transport
        # engram sites (indices into weights.engram) whose block each stage holds
        sites = {}
        for i, block in enumerate(config.engram_sites):
            sites[block] = i
        self.sites_of = [tuple(sites[b] for b in r.layers if b in sites) for r in plan.ranges]

    check_ids = V3Model.check_ids  # the same validation (it reads only `config`)

    @cached_property
    def tokenizer(self) -> Any:
        return self.archive.tokenizer

    @property
    def chat_format(self) -> Any:
        """Needle's wire format (`formats/chat_format.py`), as the whole model's."""
        from ..formats.chat_format import NeedleFormat

        return NeedleFormat(self.tokenizer)

    @property
    def has_confidence_head(self) -> bool:
        return self.weights.confidence is not None

    @property
    def stages(self) -> int:
        return len(self.plan)

    def session(self, kv_window: int | None = None, *, trace: Any = None,
                chunk: int = CHUNK) -> StagedSession:
        """A fresh, independent decode state (its caches on the stages)."""
        if trace is not None:
            raise StagePlanError("trace= is not supported on a model cut into stages")
        return StagedSession(self, kv_window=kv_window, chunk=chunk)

    def forward(self, ids: Sequence[int] | np.ndarray, *, trace: Any = None) -> np.ndarray:
        """Logits [len(ids), vocab_out] at every position (full causal attention)."""
        session = self.session(trace=trace)
        try:
            return session.extend(ids)
        finally:
            session.close()

    def confidence_logit(self, ids: Sequence[int] | np.ndarray) -> float | None:
        """Confidence-head logit over the whole sequence; None if the archive has no head."""
        if not self.has_confidence_head:
            self.check_ids(ids)
            return None
        session = self.session()
        try:
            session.prefill(ids, logits=False)
            return session.confidence_logit()
        finally:
            session.close()

    def run_batch(self, requests: Sequence[tuple[StagedSession, Any, bool]]) -> list[np.ndarray]:
        """Per request (session, ids, all_logits): every request is submitted before any is
        waited for, so the stages pipeline across requests too."""
        if len({id(s) for s, _, _ in requests}) != len(requests):
            raise ValueError("run_batch: each session may appear once per call")
        launched = [s.launch(ids, "all" if every else "last") for s, ids, every in requests]
        results = [s.finish(item) for (s, _, _), item in zip(requests, launched, strict=True)]
        return [r if every else r[-1] for r, (_, _, every) in zip(results, requests, strict=True)]

    def stage_info(self) -> list[dict]:
        """Per stage: its layers, process id, host, RSS, resident archive bytes, sessions
        (with the local transport every stage reports this one process's RSS)."""
        return self.transport.call_all("info")

    def close(self) -> None:
        """Stop the stages (local worker threads, or Ray actors)."""
        self.transport.close()

    def __enter__(self) -> StagedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        cfg = self.config
        return (f"StagedModel({self.path.name}, layers={cfg.num_layers}, "
                f"stages={list(self.plan.cuts)}, transport={self.transport.kind!r}, "
                f"numerics={self.numerics!r})")


def load_staged(
    path: str | os.PathLike[str],
    stages: int | Sequence[int] | None = 2,
    *,
    transport: str = "local",
    ray_address: str | None = None,
    placement: Sequence[Any] | None = None,
    layers: int | None = None,
    numerics: str = "deploy",
    cache: bool | None = None,
    threads: int | None = None,
    start_timeout_s: float = 120.0,
    call_timeout_s: float = 300.0,
) -> StagedModel:
    """Load a Needle 3 `.cact` archive cut into `stages` (a count, balanced by weight bytes,
    or the first layer of each stage, e.g. `[0, 7, 14]`).

    `transport="local"`: every stage in this process, one worker thread each. `"ray"`: one
    Ray actor per stage (the `ray` extra), on the cluster at `ray_address` (None: Ray's own
    default, `$RAY_ADDRESS` or a new local instance); `placement` puts stage k where its
    entry says (`ray_transport.actor_options`: a custom resource name, `{"label": value}`
    node labels as `label_selector`, or a dict of Ray actor options); without it the stages
    are spread over the nodes. Every node must see the archive at `path`. A stage that does
    not start within `start_timeout_s` is a `StageStartError`; a call with no answer within
    `call_timeout_s` a `StageLostError`.
    """
    if stages is None:
        raise StagePlanError("stages= is needed (a count, or each stage's first layer): "
                             "transport= and ray_address= apply to a model cut into stages")
    if transport not in TRANSPORTS:
        raise StagePlanError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    if transport != "ray" and (ray_address is not None or placement is not None):
        raise StagePlanError("ray_address= and placement= need transport='ray'")
    threads = resolve_threads(threads)
    if is_checkpoint(path):
        raise StagePlanError(f"{path}: Hugging Face / GGUF models are not supported with "
                             "stages (Needle 3 .cact archives only)")
    archive = open_archive(path)
    if archive.generation != 3:
        raise StagePlanError(f"{path}: Needle {archive.generation} archives are not supported "
                             "with stages (Needle 3 only)")
    kept, cfg = rung(archive, layers)
    plan = plan_stages(archive, kept, stages)
    source = os.path.abspath(os.fspath(path))  # every node opens this path (no symlinks
    # resolved: a link may point elsewhere on another machine)
    specs = [StageSpec(source, r.index, len(plan), r.first, r.end, layers, numerics, threads,
                       cache) for r in plan.ranges]
    weights = head_weights(archive, cfg, kept, numerics, threads, cache)
    if transport == "ray":
        from .ray_transport import RayTransport

        if placement is not None and len(placement) != len(plan):
            raise StagePlanError(f"placement has {len(placement)} entries for {len(plan)} "
                                 "stages")
        carrier: Any = RayTransport(specs, ray_address, placement, start_timeout_s,
                                    call_timeout_s)
    else:
        from .local import LocalTransport

        carrier = LocalTransport(specs)
    return StagedModel(archive, cfg, weights, kept, numerics, plan, carrier)
