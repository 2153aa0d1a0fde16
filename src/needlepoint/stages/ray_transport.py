"""The Ray transport: one actor per stage (the optional `ray` extra: pip install
'needlepoint[ray]').

Calls are plain actor method calls. A chunk's chain (stage 0 -> 1 -> ...) is submitted with
object references as arguments, so a stage's output goes to the next stage without waiting
for the head, and the stages pipeline across chunks. Arrays arrive read-only (zero copy):
the stage copies what it must write (`stage.own_buffer`).

Failures become typed errors naming the stage: an exception in a stage is re-raised as is
(stages raise `StageError`s), a dead actor is a `StageLostError` (Ray restarts the actor:
`max_restarts=-1`, and never retries a call: `max_task_retries=0`), no answer within
`call_timeout_s` a `StageLostError`, a stage that does not come up at load a
`StageStartError`, stages whose reservations cannot fit the cluster's nodes a
`StagePlacementError` before any actor starts (`placement.py`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from ..errors import StageError, StageLostError, StagePlanError, StageStartError
from .placement import check_fits, demand_of, local_node, nodes_of
from .stage import Stage, StageSpec
from .transport import Transport

# Ray actor options a placement entry may give (everything else is refused by name)
ACTOR_OPTIONS = {"resources", "label_selector", "num_cpus", "memory", "scheduling_strategy",
                 "runtime_env", "accelerator_type"}
RESOURCE_SHARE = 0.01  # of a named custom resource per stage: a node with 1 of it takes 100


class StageActor:
    """The actor around a `Stage` (its methods are called by name through `call`)."""

    def __init__(self, spec: StageSpec) -> None:
        self.stage = Stage(spec)

    def ready(self) -> dict:
        return self.stage.info()

    def identity(self) -> tuple[str, str]:
        """(this actor's Ray id, the stage's incarnation): Ray's public runtime context, so
        the driver never reads an actor handle's private id."""
        import ray

        return ray.get_runtime_context().get_actor_id(), self.stage.ping()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.stage, method)(*args)


def actor_options(entry: Any) -> dict[str, Any]:
    """Ray options of one stage from its placement entry: None -> spread over the nodes;
    "NAME" -> 0.01 of the custom resource NAME (`ray start --resources '{"NAME": 1}'`);
    "key=value" -> the node label key=value (`ray start --labels key=value`); a dict of Ray
    actor options (resources, label_selector, num_cpus, memory, scheduling_strategy, ...)."""
    if entry is None:
        return {"scheduling_strategy": "SPREAD"}
    if isinstance(entry, str) and entry:
        if "=" in entry:
            key, _, value = entry.partition("=")
            return {"label_selector": {key.strip(): value.strip()}}
        return {"resources": {entry: RESOURCE_SHARE}}
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - ACTOR_OPTIONS)
        if unknown:
            raise StagePlanError(f"placement entry {entry!r}: unknown Ray actor options "
                                 f"{unknown} (allowed: {sorted(ACTOR_OPTIONS)})")
        return dict(entry)
    raise StagePlanError(f"placement entry {entry!r}: expected a resource name, "
                         "'label=value' or a dict of Ray actor options")


def stage_demands(specs: Sequence[StageSpec], placement: Sequence[Any] | None,
                  stage_cpus: float | None) -> tuple[list[dict], list]:
    """Each stage's Ray actor options and the reservation `placement.check_fits` packs."""
    entries = list(placement) if placement is not None else [None] * len(specs)
    options = [actor_options(entry) for entry in entries]
    for spec, opts in zip(specs, options, strict=True):
        # a stage keeps its threads busy, unless told to share (stage_cpus=0.5)
        opts.setdefault("num_cpus", spec.threads if stage_cpus is None else stage_cpus)
    return options, [demand_of(spec.name, opts, spec.index)
                     for spec, opts in zip(specs, options, strict=True)]


def _import_ray():
    try:
        import ray
    except ImportError:
        raise StagePlanError("transport='ray' needs Ray: pip install 'needlepoint[ray]'") from None
    return ray


class _Pending:
    """A submitted call: its stage and object reference."""

    __slots__ = ("ref", "stage")

    def __init__(self, stage: int, ref: Any) -> None:
        self.stage, self.ref = stage, ref


class RayTransport(Transport):
    kind = "ray"

    def __init__(self, specs: Sequence[StageSpec], address: str | None,
                 placement: Sequence[Any] | None, start_timeout_s: float = 120.0,
                 call_timeout_s: float = 300.0, stage_cpus: float | None = None,
                 also: Sequence[tuple[Sequence[StageSpec], Sequence[Any] | None]] = ()) -> None:
        """`also`: the (specs, placement) of stages started after these (other replicas,
        replicas.py), whose reservations are checked with these before any actor starts."""
        ray = self.ray = _import_ray()
        self.specs = list(specs)
        self.call_timeout_s = call_timeout_s
        self.closed = False
        options, demands = stage_demands(self.specs, placement, stage_cpus)
        for more_specs, more_placement in also:
            demands += stage_demands(more_specs, more_placement, stage_cpus)[1]
        if not ray.is_initialized():
            if address is None and not os.environ.get("RAY_ADDRESS"):
                check_fits(demands, [local_node()])  # before starting a local instance
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        self.actor_class = ray.remote(StageActor)
        check_fits(demands, nodes_of(ray.nodes()))
        self.options = options
        self.actors = [self._start(spec, opts)
                       for spec, opts in zip(self.specs, options, strict=True)]
        self.stage_of: dict[str, int] = {}  # Ray actor id -> stage, to name a lost actor
        try:
            self._wait_ready(options, start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _start(self, spec: StageSpec, opts: dict) -> Any:
        return self.actor_class.options(max_restarts=-1, max_task_retries=0,
                                        **opts).remote(spec)

    def _wait_ready(self, options: list[dict], timeout: float) -> None:
        ray = self.ray
        refs = [actor.ready.remote() for actor in self.actors]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        finished = {ref.hex() for ref in done}
        for stage, (spec, ref, opts) in enumerate(zip(self.specs, refs, options, strict=True)):
            if ref.hex() not in finished:
                raise StageStartError(f"{spec.name} did not start within {timeout:g} s "
                                      f"(placement {opts}){self._why_pending(opts)}",
                                      spec.index)
            try:
                ray.get(ref)
                self._identify(stage)
            except ray.exceptions.RayError as error:
                reason = _last_line(str(error))
                raise StageStartError(f"{spec.name} failed to start: {reason}",
                                      spec.index) from None

    def _why_pending(self, opts: dict) -> str:
        wanted = (opts.get("resources") or {}).keys()
        try:
            offered = self.ray.cluster_resources()
        except Exception:  # noqa: BLE001 - only for the message
            return ""
        missing = [name for name in wanted if name not in offered]
        if missing:
            return (f": no node in the Ray cluster offers resource {', '.join(missing)} "
                    f"(offered: {', '.join(sorted(offered))})")
        return (": no node that matches has its CPUs free (a stage reserves num_cpus = "
                "stage_cpus, default its threads, on its node; other work may hold them), or "
                "its node is not up")

    # -- calls -------------------------------------------------------------------------------
    def submit(self, stage: int, method: str, *args: Any) -> _Pending:
        args = tuple(a.ref if isinstance(a, _Pending) else a for a in args)
        return _Pending(stage, self.actors[stage].call.remote(method, *args))

    def gather(self, pending: Sequence[_Pending], timeout: float | None = None) -> list[Any]:
        """Results in order; the first failure raised as a typed StageError."""
        limit = self.call_timeout_s if timeout is None else timeout
        results = []
        for item in pending:
            started = time.monotonic()
            try:
                results.append(self.ray.get(item.ref, timeout=limit))
            except BaseException as error:  # noqa: BLE001 - mapped to a typed error
                raise self._typed(error, item.stage, time.monotonic() - started) from None
        return results

    def _typed(self, error: BaseException, stage: int, waited: float) -> BaseException:
        ray = self.ray
        exceptions = ray.exceptions
        if isinstance(error, exceptions.RayTaskError):
            cause = getattr(error, "cause", None)
            if isinstance(cause, StageError):
                return cause
            if isinstance(cause, exceptions.RayActorError):
                error = cause
            else:
                spec = self.specs[stage]
                kind = type(cause).__name__ if cause is not None else "error"
                return StageError(f"{spec.name} failed: {kind}: {cause}", stage)
        if isinstance(error, exceptions.RayActorError):
            lost = self.stage_of.get(str(error.actor_id), stage)
            spec = self.specs[lost]
            return StageLostError(
                f"{spec.name} was lost during the request (its actor process died or is "
                f"unreachable: {_last_line(str(error))}); Ray restarts it, and sessions whose "
                f"cache lived there are gone", lost)
        if isinstance(error, exceptions.GetTimeoutError):
            silent = self._first_silent(stage)
            spec = self.specs[silent]
            lost = StageLostError(f"{spec.name} did not answer within {waited:.0f} s "
                                  f"(call_timeout_s); the request is abandoned", silent)
            lost.timed_out = True  # recovery.py restarts it
            return lost
        if isinstance(error, exceptions.RayError):
            spec = self.specs[stage]
            return StageLostError(f"{spec.name}: {type(error).__name__}: "
                                  f"{_last_line(str(error))}", stage)
        return error

    def _first_silent(self, default: int, wait_s: float = 2.0) -> int:
        """The first stage, in chain order, that does not answer a ping within `wait_s` (a
        stage's calls run in order, so those after a stalled one wait behind it)."""
        pings = [actor.call.remote("ping") for actor in self.actors]
        done, _ = self.ray.wait(pings, num_returns=len(pings), timeout=wait_s)
        answered = {ref.hex() for ref in done}
        for k, ref in enumerate(pings):
            if ref.hex() not in answered:
                return k
        return default

    def fire(self, stage: int, method: str, *args: Any) -> None:
        if self.closed:
            return
        try:
            self.actors[stage].call.remote(method, *args)
        except Exception:  # noqa: BLE001 - Ray shut down, actor gone: nothing to free
            pass

    # -- recovery (recovery.py) -------------------------------------------------------------
    def restart(self, stage: int) -> None:
        """Kill a stage that stopped answering so that Ray restarts it (max_restarts=-1)."""
        try:
            self.ray.kill(self.actors[stage], no_restart=False)
        except Exception:  # noqa: BLE001 - already gone: Ray restarts it or wait_back replaces
            pass

    def wait_back(self, stage: int, timeout: float) -> str:
        """The incarnation of `stage` once it answers again: Ray's restart of its actor, or,
        where the actor is dead for good, a replacement started with the same options (the
        old one killed first: no orphan). A `StageLostError` if none answers in `timeout`."""
        ray, spec = self.ray, self.specs[stage]
        deadline = time.monotonic() + timeout
        problem: Any = "no answer"
        while (left := deadline - time.monotonic()) > 0:
            try:
                return self._identify(stage, timeout=min(left, 10.0))
            except ray.exceptions.GetTimeoutError as error:
                problem = error
            except ray.exceptions.ActorDiedError as error:
                problem = error
                if not getattr(error, "preempted", False) and _dead_for_good(error):
                    self._replace(stage)
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            except ray.exceptions.RayError as error:  # restarting: unavailable for now
                problem = error
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        raise StageLostError(f"{spec.name} is not back within {timeout:g} s "
                             f"({_last_line(str(problem))})", stage)

    def _replace(self, stage: int) -> None:
        old = self.actors[stage]
        try:
            self.ray.kill(old, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.stage_of = {a: k for a, k in self.stage_of.items() if k != stage}
        self.actors[stage] = self._start(self.specs[stage], self.options[stage])

    def _identify(self, stage: int, timeout: float | None = None) -> str:
        """Ask `stage`'s actor who it is (its Ray id, recorded in `stage_of`); its
        incarnation."""
        actor_id, incarnation = self.ray.get(self.actors[stage].identity.remote(),
                                             timeout=timeout)
        self.stage_of[actor_id] = stage
        return incarnation

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _dead_for_good(error: BaseException) -> bool:
    """An ActorDiedError that says the actor will not be restarted (killed for good, its
    restarts used up): Ray's restart of a crashed actor answers "unavailable" meanwhile."""
    text = str(error)
    return "will not be restarted" in text or "no_restart" in text or (
        "max_restarts" in text and "exceeded" in text)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text
