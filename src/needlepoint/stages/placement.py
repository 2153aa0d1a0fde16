"""Does a plan's placement fit the Ray cluster? Checked before any actor starts, so a stage
that could never be scheduled is a `StagePlacementError` at once (naming the CPUs the stages
reserve, the CPUs the nodes offer and the fix), not a `StageStartError` after
`start_timeout_s`.

Each stage reserves `num_cpus` on one node (`stage_cpus=`, default its `threads`) plus the
custom resources and node labels its placement entry asks for. `fits` packs the stages on the
nodes' totals, largest reservation first, each on the matching node with the most CPUs left:
pure data in, so it is tested without a cluster. Reservations Ray cannot express are refused
by `check_stage_cpus`: a fraction of a CPU must be below 1, more than one CPU a whole number.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import StagePlacementError, StagePlanError

EPS = 1e-9


@dataclass(frozen=True)
class Demand:
    """What one stage reserves on its node."""

    name: str  # "stage 1 (layers 2-3)"
    cpus: float
    stage: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)  # custom resources
    labels: Mapping[str, str] = field(default_factory=dict)  # plain key=value labels only


@dataclass(frozen=True)
class Node:
    """One alive node: its total resources and its labels."""

    name: str
    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def cpus(self) -> float:
        return float(self.resources.get("CPU", 0.0))


def check_stage_cpus(value: Any) -> float | None:
    """`stage_cpus` as Ray accepts it (None: each stage reserves its `threads`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not math.isfinite(float(value)) or value <= 0:
        raise StagePlanError(f"stage_cpus must be a positive number of CPUs (0.5 lets two "
                             f"stages share a CPU), got {value!r}")
    value = float(value)
    if value > 1 and not value.is_integer():
        raise StagePlanError(f"stage_cpus={value:g}: Ray reserves either a fraction of one "
                             f"CPU (below 1) or whole CPUs")
    return value


def demand_of(name: str, options: Mapping[str, Any], stage: int | None = None) -> Demand:
    """A stage's reservation from its Ray actor options (`ray_transport.actor_options` plus
    num_cpus). Label selectors with operators (`!x`, `in(...)`) are not checked here."""
    labels = {k: v for k, v in (options.get("label_selector") or {}).items()
              if isinstance(v, str) and not v.startswith(("!", "in(", "!in("))}
    return Demand(name, float(options.get("num_cpus", 1)), stage,
                  dict(options.get("resources") or {}), labels)


def nodes_of(ray_nodes: Sequence[Mapping[str, Any]]) -> list[Node]:
    """The alive nodes of `ray.nodes()`."""
    return [Node(str(n.get("NodeManagerAddress") or n.get("NodeID", "?"))[:40],
                 dict(n.get("Resources") or {}), dict(n.get("Labels") or {}))
            for n in ray_nodes if n.get("Alive")]


def local_node() -> Node:
    """The node a new local Ray instance (`ray.init()` with no address) would be: this
    machine's CPUs as Ray counts them (its cgroup / affinity limits), no custom resource."""
    try:
        from ray._private.utils import get_num_cpus  # Ray's own count for a new instance

        cpus = float(get_num_cpus())
    except Exception:  # noqa: BLE001 - another Ray version: the affinity mask
        cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else os.cpu_count() or 1)
    return Node("this machine (a new local Ray instance)", {"CPU": cpus})


def _matches(node: Node, demand: Demand, left: Mapping[str, float]) -> bool:
    if any(node.labels.get(k) != v for k, v in demand.labels.items()):
        return False
    return all(left.get(k, 0.0) + EPS >= amount for k, amount in demand.resources.items())


def fits(demands: Sequence[Demand], nodes: Sequence[Node]) -> tuple[int | None, str] | None:
    """None if every stage can be placed at once; else (the stage that cannot, why not)."""
    left = [dict(node.resources) for node in nodes]
    for demand in sorted(demands, key=lambda d: -d.cpus):
        candidates = [i for i, node in enumerate(nodes) if _matches(node, demand, left[i])]
        if not candidates:
            return demand.stage, _no_node(demand, nodes)
        best = max(candidates, key=lambda i: left[i].get("CPU", 0.0))
        if left[best].get("CPU", 0.0) + EPS < demand.cpus:
            return demand.stage, _short_of_cpus(demands, nodes, demand, candidates)
        left[best]["CPU"] = left[best].get("CPU", 0.0) - demand.cpus
        for key, amount in demand.resources.items():
            left[best][key] -= amount
    return None


def _cpus(value: float) -> str:
    return f"{value:g} CPU" + ("" if value == 1 else "s")


def _no_node(demand: Demand, nodes: Sequence[Node]) -> str:
    wanted = [f"resource {k}" for k in demand.resources] + [
        f"label {k}={v}" for k, v in demand.labels.items()]
    offered = sorted({k for n in nodes for k in n.resources if k != "CPU"} - {"memory",
                     "object_store_memory"})
    return (f"{demand.name}: no node of the Ray cluster offers {' and '.join(wanted)} "
            f"(offered: {', '.join(offered) or 'nothing but CPUs and memory'})")


def _short_of_cpus(demands: Sequence[Demand], nodes: Sequence[Node], demand: Demand,
                   candidates: Sequence[int]) -> str:
    total = sum(d.cpus for d in demands)
    per_node = ", ".join(f"{nodes[i].name}: {nodes[i].cpus:g}" for i in candidates)
    return (f"{len(demands)} stages reserve {_cpus(total)} in all ({_cpus(demand.cpus)} for "
            f"{demand.name}), but the {len(candidates)} node(s) that may hold it offer "
            f"{per_node} CPUs (cluster: {_cpus(sum(n.cpus for n in nodes))}). Fix: "
            f"stage_cpus=0.5 (--stage-cpus 0.5) to let stages share a CPU on purpose, fewer "
            f"stages or threads, or more nodes / `ray start --num-cpus N`")


def check_fits(demands: Sequence[Demand], nodes: Sequence[Node]) -> None:
    """Raise StagePlacementError when the stages cannot all be placed on `nodes`."""
    if not nodes:
        raise StagePlacementError("the Ray cluster has no alive node to place stages on")
    problem = fits(demands, nodes)
    if problem:
        stage, why = problem
        raise StagePlacementError(f"the stages do not fit the Ray cluster: {why}", stage)
