"""A model cut at block boundaries into stages: `load_staged` and `StagedModel`.

Any family with the layer-range interface (`models.layer_range.LayerRange`): Needle 3
archives, Llama-family and GPT-2 models from Hugging Face directories or GGUF files. The head
(this object) holds the tokenizer and the head's part (`models.parts.load_part(head=True)`:
Needle 3's embedding, engram sites, final norm, LM head and confidence head; a transformer's
embedding, final norm and LM head); each stage (`stage.Stage`, on the chosen transport) holds
its contiguous range of blocks. The public interface is the single-process model's
(`forward`, `session`, `confidence_logit`, `check_ids`, `run_batch`, `tokenizer`, `config`,
`has_confidence_head`), so `Needle`, the CLI and the server take it unchanged. In exact
numerics (Needle 3 "deploy", transformer "int8") its logits are the single-process logits
bit for bit, for every split.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelInputError, StagePlanError
from ..models.layer_range import LayerRange
from ..models.loader import resolve_threads
from ..models.parts import load_part, part_numerics
from ..models.protocol import ModelCapabilities
from .pipeline import run_batch
from .placement import check_stage_cpus
from .plan import StagePlan, plan_stages
from .recovery import Recovery, RecoveryPolicy
from .replicas import check_replicas
from .session import StagedSession
from .stage import StageSpec

TRANSPORTS = ("local", "ray")


class StagedModel:
    """A model whose blocks run on stages. Use `needlepoint.load(path, stages=...)`."""

    def __init__(self, path: str, part: LayerRange, plan: StagePlan, transport,
                 recovery: RecoveryPolicy | None = None) -> None:
        self.path = path
        self.part = part
        self.config = part.config
        self.numerics = part.numerics
        self.exact = part.exact
        self.plan = plan
        self.transport = transport
        self.micro_batches: int | None = None  # run_batch (None: pipeline.py's default)
        self._lock = threading.Lock()
        self._calls = 0  # run_batch calls in flight
        # replay on a lost stage: the live sessions, the losses, the replays
        self.recovery = Recovery(self, recovery or RecoveryPolicy())
        self.recovery.incarnations = dict(enumerate(transport.call_all("ping")))

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        """Token ids as int64, or a ModelInputError naming what is wrong."""
        return self.part.check_ids(ids, position)

    @cached_property
    def tokenizer(self) -> Any:
        return self.part.tokenizer

    @property
    def chat_format(self) -> Any:
        """The whole model's chat format: the head's part knows its family's (Needle's wire
        format, or the model's chat template; not part of the `LayerRange` Protocol, whose
        runtime check would evaluate it, and a template-less checkpoint cannot chat)."""
        return self.part.chat_format

    @property
    def has_confidence_head(self) -> bool:
        return self.part.has_confidence_head

    @property
    def capabilities(self) -> ModelCapabilities:
        """What this model offers beyond the core interface (`models/protocol.py`): one engine
        step in flight per stage."""
        return ModelCapabilities(run_batch=True, pipeline_depth=self.pipeline_depth,
                                 confidence_head=self.has_confidence_head,
                                 name=Path(self.path).stem)

    @property
    def stages(self) -> int:
        return len(self.plan)

    @property
    def pipeline_depth(self) -> int:
        """Steps the server's scheduler keeps in flight at once (one engine loop per stage:
        api/scheduler.py), so the stages work on different requests' steps at once."""
        return len(self.plan)

    def session(self, kv_window: int | None = None, *, trace: Any = None,
                chunk: int | None = None) -> StagedSession:
        """A fresh, independent decode state (its caches on the stages); `chunk`: positions
        per chunk (default: the family's single-process prefill chunk)."""
        if trace is not None:
            raise StagePlanError("trace= is not supported on a model cut into stages")
        if kv_window is not None and not self.part.kv_windows:
            raise ModelInputError("kv_window= bounds Needle 3 attention rings; this model's "
                                  "caches keep every position")
        return StagedSession(self, kv_window=kv_window,
                             chunk=self.part.chunk if chunk is None else chunk)

    def forward(self, ids: Sequence[int] | np.ndarray, *, trace: Any = None) -> np.ndarray:
        """Logits [len(ids), vocab] at every position (full causal attention)."""
        session = self.session(trace=trace)
        try:
            return session.extend(ids)
        finally:
            session.close()

    def confidence_logit(self, ids: Sequence[int] | np.ndarray) -> float | None:
        """Confidence-head logit over the whole sequence; None if the model has no head."""
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
        """Per request (session, ids, all_logits): the requests go through the stages in
        micro-batches (`micro_batches`, else `pipeline.default_micro_batches`), all submitted
        before any is waited for, so stage k works on micro-batch m while stage k+1 works on
        m-1 (`pipeline.py`); each request's logits are its own bits (exact numerics). While
        another call is in flight (the scheduler's other engine loops keep the stages busy)
        a call to stages that stack rows (Needle 3 deploy) is one micro-batch: fewer hops,
        and each stage reads its weights once for all the rows."""
        with self._lock:
            self._calls += 1
            alone = self._calls == 1
        try:
            micro = self.micro_batches or (1 if self.part.stacks and not alone else None)
            return self.recovery.run([session for session, _, _ in requests],
                                     lambda: run_batch(self, requests, micro), regroup=True)
        finally:
            with self._lock:
                self._calls -= 1

    def stage_info(self) -> list[dict]:
        """Per stage: its layers, process id, host, RSS, resident archive bytes, sessions
        (with the local transport every stage reports this one process's RSS)."""
        return self.transport.call_all("info")

    def stage_health(self) -> dict:
        """Losses, replays and the stages recovering now ("degraded" meanwhile): the
        server's /health and /metrics read it (recovery.py)."""
        return self.recovery.health()

    def close(self) -> None:
        """Stop the stages (local worker threads, or Ray actors)."""
        self.transport.close()

    def __enter__(self) -> StagedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"StagedModel({os.path.basename(self.path)}, "
                f"layers={self.config.num_layers}, stages={list(self.plan.cuts)}, "
                f"transport={self.transport.kind!r}, numerics={self.numerics!r})")


def _model_file(path: str | os.PathLike[str]) -> str:
    """A known name ("smollm2") resolved to its file; the path every node opens (absolute,
    no symlinks resolved: a link may point elsewhere on another machine)."""
    from ..models.known import known_file

    return os.path.abspath(os.fspath(known_file(path)))


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
    stage_cpus: float | None = None,
    max_stage_recoveries: int = 3,
    recovery_window_s: float = 300.0,
    recovery_timeout_s: float = 60.0,
    replicas: int = 1,
) -> Any:
    """Load a model cut into `stages` (a count, balanced by weight bytes, or the first layer
    of each stage, e.g. `[0, 7, 14]`): a Needle 3 `.cact` archive, a Hugging Face model
    directory or a GGUF file (Llama family, GPT-2; `numerics` "deploy" = "int8", or "float").

    `transport="local"`: every stage in this process, one worker thread each. `"ray"`: one
    Ray actor per stage (the `ray` extra), on the cluster at `ray_address` (None: Ray's own
    default, `$RAY_ADDRESS` or a new local instance); `placement` puts stage k where its
    entry says (`ray_transport.actor_options`: a custom resource name, `{"label": value}`
    node labels as `label_selector`, or a dict of Ray actor options); without it the stages
    are spread over the nodes. Each stage reserves `stage_cpus` CPUs on its node (default:
    `threads`; a fraction such as 0.5 lets stages share a CPU on purpose); stages that cannot
    all fit the cluster's nodes are a `StagePlacementError` before any actor starts. Every
    node must see the model at `path`. A stage that does not start within `start_timeout_s`
    is a `StageStartError`; a call with no answer within `call_timeout_s` a `StageLostError`.
    A lost stage (process died, or no answer within `call_timeout_s`) is restarted and the
    sessions that lived on it are replayed, the failed call re-issued (`recovery.py`), up to
    `max_stage_recoveries` losses of a stage within `recovery_window_s`, each back within
    `recovery_timeout_s`; past that (or with `max_stage_recoveries=0`) the call fails with
    the `StageLostError`. `replicas=R` places R copies of the stages (`placement`: one
    entry per stage, or per stage of every replica) and spreads sessions over them; a lost
    replica's sessions move to another by the same replay (`replicas.py`).
    """
    policy = RecoveryPolicy(max_stage_recoveries, recovery_window_s, recovery_timeout_s)
    if stages is None:
        raise StagePlanError("stages= is needed (a count, or each stage's first layer): "
                             "transport= and ray_address= apply to a model cut into stages")
    if transport not in TRANSPORTS:
        raise StagePlanError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport != "ray" and (ray_address is not None or placement is not None
                               or stage_cpus is not None):
        raise StagePlanError("ray_address=, placement= and stage_cpus= need transport='ray'")
    stage_cpus = check_stage_cpus(stage_cpus)
    threads = resolve_threads(threads)
    source = _model_file(path)
    allowed = part_numerics(source)
    if numerics not in allowed:
        raise ValueError(f"numerics must be one of {allowed}, got {numerics!r}")
    part = load_part(source, head=True, layers=layers, numerics=numerics, threads=threads,
                     cache=cache)
    plan = plan_stages(part.block_bytes(), stages)
    specs = [StageSpec(source, r.index, len(plan), r.first, r.end, layers, numerics, threads,
                       cache) for r in plan.ranges]
    places = check_replicas(replicas, len(plan), placement)
    models: list[StagedModel] = []
    try:
        for r, place in enumerate(places):
            # the first replica's check covers every replica's stages, before any starts
            also = [(specs, later) for later in places[r + 1:]] if r == 0 else []
            carrier = _transport(transport, specs, ray_address, place, start_timeout_s,
                                 call_timeout_s, stage_cpus, also)
            try:
                models.append(StagedModel(source, part, plan, carrier, policy))
            except BaseException:
                carrier.close()
                raise
    except BaseException:
        for done in models:
            done.close()
        raise
    if replicas == 1:
        return models[0]
    from .replicas import ReplicatedModel

    return ReplicatedModel(models)


def _transport(kind: str, specs: list[StageSpec], address: str | None, placement: Any,
               start_timeout_s: float, call_timeout_s: float, stage_cpus: float | None,
               also: list) -> Any:
    if kind == "ray":
        from .ray_transport import RayTransport

        return RayTransport(specs, address, placement, start_timeout_s, call_timeout_s,
                            stage_cpus, also)
    from .local import LocalTransport

    return LocalTransport(specs)
