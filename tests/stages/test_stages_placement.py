"""Placement that fits (`stages/placement.py`): the stages' CPU reservations are packed on
the cluster's nodes before any actor starts; what cannot fit is a StagePlacementError naming
the numbers and the fix. The nodes here are data, as `ray.nodes()` reports them; the same
check on a real two-node cluster is in `ray_cases.py`."""

from __future__ import annotations

import pytest

from needlepoint.errors import StagePlacementError, StagePlanError, StageStartError
from needlepoint.stages import load_staged
from needlepoint.stages.placement import (
    Demand,
    check_fits,
    check_stage_cpus,
    demand_of,
    nodes_of,
)
from needlepoint.stages.ray_transport import actor_options


def _nodes(*cpus: float, extra: list[dict] | None = None) -> list:
    raw = [{"Alive": True, "NodeManagerAddress": f"10.0.0.{i + 1}",
            "Resources": {"CPU": c, "memory": 1e9, **((extra or [{}] * len(cpus))[i])},
            "Labels": {"zone": "a" if i == 0 else "b"}}
           for i, c in enumerate(cpus)]
    raw.append({"Alive": False, "NodeManagerAddress": "10.0.0.99", "Resources": {"CPU": 64}})
    return nodes_of(raw)


def _demands(count: int, cpus: float, entries=None) -> list[Demand]:
    entries = entries or [None] * count
    return [demand_of(f"stage {k}", dict(actor_options(e), num_cpus=cpus), k)
            for k, e in enumerate(entries)]


def test_four_one_cpu_stages_do_not_fit_two_cpus_and_the_message_has_numbers_and_fix():
    nodes = _nodes(2)  # the dead 64-CPU node does not count
    assert len(nodes) == 1
    with pytest.raises(StagePlacementError) as caught:
        check_fits(_demands(4, 1), nodes)
    text = str(caught.value)
    assert "4 stages reserve 4 CPUs" in text and "10.0.0.1: 2 CPUs" in text
    assert "stage_cpus=0.5" in text and "--stage-cpus 0.5" in text
    assert isinstance(caught.value, StageStartError)
    check_fits(_demands(4, 0.5), nodes)  # sharing on purpose fits
    check_fits(_demands(2, 1), nodes)


def test_packing_counts_each_node_on_its_own():
    nodes = _nodes(2, 1)
    check_fits(_demands(3, 1), nodes)  # 2 + 1
    with pytest.raises(StagePlacementError, match="4 stages reserve 4 CPUs"):
        check_fits(_demands(4, 1), nodes)
    with pytest.raises(StagePlacementError, match="2 stages reserve 4 CPUs"):
        check_fits(_demands(2, 2), nodes)  # 4 CPUs in all, but no node has 2 left twice
    check_fits(_demands(2, 1) + _demands(1, 0.5), nodes)


def test_pinned_stages_count_against_their_node_only():
    nodes = _nodes(2, 2, extra=[{"node_a": 1}, {"node_b": 1}])
    check_fits(_demands(4, 1, ["node_a", "node_b", "node_a", "node_b"]), nodes)
    with pytest.raises(StagePlacementError, match=r"1 node\(s\) that may hold it offer "
                       r"10.0.0.1: 2 CPUs") as caught:
        check_fits(_demands(3, 1, ["node_a"] * 3), nodes)
    assert caught.value.stage in (0, 1, 2)
    check_fits(_demands(4, 0.5, ["node_a"] * 4), nodes)
    with pytest.raises(StagePlacementError, match="stage 1: no node of the Ray cluster "
                       "offers resource nowhere") as caught:
        check_fits(_demands(2, 1, ["node_a", "nowhere"]), nodes)
    assert caught.value.stage == 1
    check_fits(_demands(2, 1, ["zone=b", "zone=b"]), nodes)
    with pytest.raises(StagePlacementError, match="label zone=c"):
        check_fits(_demands(1, 1, ["zone=c"]), nodes)


def test_stage_cpus_values():
    assert check_stage_cpus(None) is None
    assert check_stage_cpus(0.5) == 0.5 and check_stage_cpus(2) == 2.0
    for bad in (0, -1, 1.5, float("nan"), True, "1"):
        with pytest.raises(StagePlanError, match="stage_cpus"):
            check_stage_cpus(bad)


def test_stage_cpus_needs_ray():
    from stages_helpers import fixture_path

    with pytest.raises(StagePlanError, match="stage_cpus= need transport='ray'"):
        load_staged(fixture_path("tiny"), 2, stage_cpus=0.5)


def test_too_many_stages_for_a_new_local_instance_fail_before_ray_starts(monkeypatch):
    """The issue's case: `needlepoint.load(path, stages=4, transport="ray")` with no cluster
    on a 2-CPU machine. The check runs against this machine's CPUs before a local Ray
    instance is started (ray.init is never called here), within 5 s."""
    import time

    import ray
    from stages_helpers import fixture_path

    import needlepoint
    from needlepoint.stages import placement, ray_transport

    def no_init(*args, **kwargs):  # nothing may start Ray outside a loopback namespace
        raise AssertionError("ray.init was called")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", no_init)
    monkeypatch.setattr(ray_transport, "local_node",
                        lambda: placement.Node("this machine", {"CPU": 2.0}))
    assert not ray.is_initialized()
    started = time.monotonic()
    with pytest.raises(StagePlacementError, match=r"4 stages reserve 4 CPUs .* this machine: "
                       r"2 CPUs .*stage_cpus=0.5"):
        needlepoint.load(fixture_path("tiny"), stages=4, transport="ray", cache=False)
    assert time.monotonic() - started < 5
    assert placement.local_node().cpus >= 1  # Ray's own count of this machine's CPUs
