"""A stage killed mid-request on a real two-node Ray cluster, replayed (issue 30): runs
`ray_recovery_cases.py` once inside a loopback-only network namespace, as
`test_stages_ray.py` runs `ray_cases.py` (`stages_helpers.run_ray_cases`), and reports each
of its cases as a test here; nothing (process, /dev/shm file) may outlive the run."""

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
    "test_needle3_requests_survive_a_killed_stage",
    "test_smollm2_requests_survive_a_killed_stage",
    "test_streaming_server_answer_survives_a_killed_stage",
    "test_needlepoint_serve_streams_through_a_killed_stage",
    "test_silent_stage_is_restarted_and_replayed",
    "test_replicas_across_two_nodes_move_a_lost_replicas_sessions",
    "test_no_stage_actor_is_left_after_recovery",
]
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory) -> dict:
    return run_ray_cases(Path(__file__).with_name("ray_recovery_cases.py"),
                         tmp_path_factory.mktemp("ray-recovery"), TIMEOUT_S)


@pytest.mark.parametrize("case", CASES)
def test_ray_recovery_case(ray_run, case):
    check_ray_case(ray_run, case, "ray_recovery_cases.py")


def test_every_case_is_reported(ray_run):
    check_every_case_reported(ray_run, CASES)


def test_nothing_is_left_behind(ray_run):
    """No Ray process of the run is alive and /dev/shm holds nothing new afterwards."""
    check_nothing_left(ray_run)
