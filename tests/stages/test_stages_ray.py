"""Stages on a real two-node Ray cluster: runs `ray_cases.py` (a pytest module of its own)
once, inside a network namespace that has nothing but loopback, and reports each of its
cases as a test here.

Ray advertises a machine's routable address even when told 127.0.0.1; inside `unshare -n`
(after `ip link set lo up`) there is no other address to advertise or reach. The namespace
also has its own process tree (`--pid --fork --kill-child --mount-proc`: every Ray process
dies with it, also when this test is interrupted)
and its own tmpfs on /dev/shm holding Ray's temp dir and object stores (`RAY_TMPDIR`): no
process and no /dev/shm file outlives the run. Where such a namespace cannot be made (not
root, no `unshare`), the cases fail with a message that says so: they are never skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stages_helpers import (
    check_every_case_reported,
    check_nothing_left,
    check_ray_case,
    run_ray_cases,
)

CASES = [
    "test_isolated_to_loopback",
    "test_every_split_across_two_nodes",
    "test_shipped_across_two_nodes[2]",
    "test_shipped_across_two_nodes[4]",
    "test_float_numerics_across_nodes",
    "test_stage_rss_scales_with_its_share",
    "test_sessions_many_at_once_across_nodes",
    "test_non_finite_refused_across_a_hop",
    "test_killed_stage_fails_the_request_fast_and_recovers",
    "test_server_stays_healthy_when_a_stage_dies",
    "test_stage_that_never_starts_is_an_error_at_load",
    "test_stalled_stage_times_out_naming_it",
    "test_placement_that_cannot_fit_fails_fast_and_stage_cpus_shares",
    "test_transformers_across_two_nodes",
    "test_qwen_and_gemma_across_two_nodes",
    "test_gguf_weights_in_place_across_two_nodes",
    "test_rewind_across_nodes",
]
TIMEOUT_S = 900


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory) -> dict:
    return run_ray_cases(Path(__file__).with_name("ray_cases.py"),
                         tmp_path_factory.mktemp("ray-cases"), TIMEOUT_S)


@pytest.mark.parametrize("case", CASES)
def test_ray_case(ray_run, case):
    check_ray_case(ray_run, case, "ray_cases.py")


def test_every_ray_case_is_reported(ray_run):
    check_every_case_reported(ray_run, CASES)


def test_nothing_is_left_behind(ray_run):
    """No Ray process of the run is alive and /dev/shm holds nothing new afterwards."""
    check_nothing_left(ray_run)
