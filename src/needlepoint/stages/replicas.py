"""Replicas of a staged model: `load_staged(path, stages=K, replicas=R)`
places R copies of the K-stage pipeline, each replica its own stages (actors) and its own
`Recovery`; the head's part is loaded once and shared.

Sessions are spread over the replicas (a new session goes to the one with the fewest live
sessions among those with every stage up). When a replica's stage is lost, its sessions move
to a surviving replica by the same replay as `recovery.py` (their tokens re-run there on
every stage), with no wait for Ray's restart of the lost stage; the restarted stage takes new
sessions once it answers again. `run_batch` runs each replica's share of a call on its own
pipeline at once, and regroups the requests whose sessions moved.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import StageLostError, StagePlanError
from .recovery import SessionsMoved

REGROUPS = 2  # times one run_batch call follows sessions that moved


def check_replicas(replicas: int, stages: int, placement: Sequence[Any] | None) -> list:
    """Each replica's placement: `placement` has one entry per stage (every replica the
    same) or one per stage of every replica (replica-major); None spreads them."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise StagePlanError(f"replicas must be a positive int, got {replicas!r}")
    if placement is None:
        return [None] * replicas
    entries = list(placement)
    if len(entries) == stages:
        return [entries] * replicas
    if len(entries) == stages * replicas:
        return [entries[r * stages:(r + 1) * stages] for r in range(replicas)]
    if replicas == 1:
        raise StagePlanError(f"placement has {len(entries)} entries for {stages} stages")
    raise StagePlanError(f"placement has {len(entries)} entries for {stages} stages x "
                         f"{replicas} replicas (give {stages} or {stages * replicas})")


class ReplicatedModel:
    """R replicas of one staged model, with the staged model's interface (`session`,
    `forward`, `confidence_logit`, `check_ids`, `run_batch`, `stage_info`, `stage_health`,
    `close`, ...); what it does not define (tokenizer, config, plan, numerics, ...) is the
    first replica's, identical in all."""

    def __init__(self, replicas: Sequence[Any]) -> None:
        self.replicas = list(replicas)
        for replica in self.replicas:
            replica.recovery.group = self
        self._pool = ThreadPoolExecutor(len(self.replicas), thread_name_prefix="replica")
        self._placing = threading.Lock()  # sessions opened at once still spread evenly

    def __getattr__(self, name: str) -> Any:
        if name == "replicas":  # not set yet (during unpickling / a failed __init__)
            raise AttributeError(name)
        return getattr(self.replicas[0], name)

    @property
    def pipeline_depth(self) -> int:
        """Engine loops that keep every replica's stages busy (api/scheduler.py)."""
        return sum(replica.pipeline_depth for replica in self.replicas)

    # -- placing sessions -------------------------------------------------------------------
    def _healthy(self, exclude: Any = None) -> list[Any]:
        for replica in self.replicas:
            if replica is not exclude:  # its own loss is being handled: not back yet
                replica.recovery.refresh()
        return [r for r in self.replicas if r is not exclude and not r.recovery.down
                and not r.recovery.recovering]

    def sibling_for(self, replica: Any) -> Any:
        """The replica a lost replica's sessions move to (fewest sessions), or None."""
        healthy = self._healthy(exclude=replica)
        return min(healthy, key=lambda r: len(r.recovery.sessions)) if healthy else None

    def _pick(self) -> Any:
        healthy = self._healthy() or self.replicas
        return min(healthy, key=lambda r: len(r.recovery.sessions))

    def session(self, kv_window: int | None = None, *, trace: Any = None,
                chunk: int | None = None) -> Any:
        with self._placing:
            return self._pick().session(kv_window, trace=trace, chunk=chunk)

    def forward(self, ids: Any, *, trace: Any = None) -> np.ndarray:
        return self._pick().forward(ids, trace=trace)

    def confidence_logit(self, ids: Any) -> float | None:
        return self._pick().confidence_logit(ids)

    # -- the engine step --------------------------------------------------------------------
    def run_batch(self, requests: Sequence[tuple[Any, Any, bool]]) -> list[np.ndarray]:
        """Each replica's requests on its own pipeline, the replicas at once."""
        out: list[Any] = [None] * len(requests)
        pending = list(range(len(requests)))
        for _ in range(REGROUPS + 1):
            groups: dict[int, tuple[Any, list[int]]] = {}
            for i in pending:
                replica = requests[i][0].model
                groups.setdefault(id(replica), (replica, []))[1].append(i)
            calls = [(idx, self._pool.submit(_share, replica, [requests[i] for i in idx]))
                     for replica, idx in groups.values()]
            moved: list[int] = []
            for idx, call in calls:
                results = call.result()
                if results is None:
                    moved += idx
                    continue
                for i, logits in zip(idx, results, strict=True):
                    out[i] = logits
            if not moved:
                return out
            pending = moved
        raise StageLostError(f"sessions moved between replicas more than {REGROUPS} times in "
                             "one call", None)

    # -- reports ----------------------------------------------------------------------------
    def stage_info(self) -> list[dict]:
        return [{**info, "replica": r} for r, replica in enumerate(self.replicas)
                for info in replica.stage_info()]

    def stage_health(self) -> dict:
        reports = [replica.stage_health() for replica in self.replicas]
        summed = {key: sum(h[key] for h in reports) for key in
                  ("losses", "recoveries", "replays", "replayed_tokens", "failures",
                   "live_sessions")}
        recovering = [[r, k] for r, h in enumerate(reports) for k in h["recovering"]]
        times = [h["last_recovery_s"] for h in reports if h["last_recovery_s"] is not None]
        return {"status": "degraded" if recovering else "ok", "recovering": recovering,
                **summed, "replicas": len(self.replicas),
                "last_recovery_s": max(times) if times else None}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for replica in self.replicas:
            replica.close()

    def __enter__(self) -> ReplicatedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplicatedModel({len(self.replicas)} x {self.replicas[0]!r})"


def _share(replica: Any, requests: list) -> list | None:
    """One replica's requests; None when their sessions moved to another replica."""
    try:
        return replica.run_batch(requests)
    except SessionsMoved:
        return None
