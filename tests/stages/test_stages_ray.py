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

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import REPO_ROOT

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
    "test_rewind_across_nodes",
]
TIMEOUT_S = 900
INSIDE = """set -e
ip link set lo up
mount -t tmpfs -o size=2g needlepoint-ray /dev/shm
export RAY_TMPDIR=/dev/shm/ray
mkdir -p "$RAY_TMPDIR"
exec "$@"
"""


def _namespace_problem() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "they need root to make a network namespace (unshare -n); run as root, as CI does"
    for tool in ("unshare", "ip", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (util-linux / iproute2)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed: pip install -e '.[test]' installs it (the 'ray' extra)"
    probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c",
                            "ip link set lo up && mount -t tmpfs x /dev/shm"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"`unshare --net --pid --mount-proc` failed here: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory) -> dict:
    problem = _namespace_problem()
    if problem:
        pytest.fail(f"the Ray stage tests must run in a loopback-only network namespace, and "
                    f"{problem}", pytrace=False)
    work = tmp_path_factory.mktemp("ray-cases")
    report = work / "report.xml"
    command = [
        "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", INSIDE,
        "inside",
        sys.executable, "-m", "pytest", str(Path(__file__).with_name("ray_cases.py")), "-q",
        "-p", "no:cacheprovider", f"--basetemp={work / 'tmp'}", f"--junitxml={report}",
        "-o", "junit_family=xunit1", "-s",
    ]
    env = dict(os.environ, NEEDLEPOINT_CACHE="0", RAY_USAGE_STATS_ENABLED="0")
    shm_before = set(os.listdir("/dev/shm"))
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:  # the namespace (and Ray in it) dies with it
        output = f"timed out after {TIMEOUT_S} s\n{error.stdout or ''}{error.stderr or ''}"
    results: dict[str, str | None] = {}
    if report.is_file():
        for case in ET.parse(report).getroot().iter("testcase"):
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            skipped = case.find("skipped")
            text = None
            if problem is not None:
                text = (problem.get("message") or "") + "\n" + (problem.text or "")
            elif skipped is not None:
                text = f"skipped: {skipped.get('message')}"
            results[case.get("name")] = text
    left = {"shm": sorted(set(os.listdir("/dev/shm")) - shm_before),
            "processes": _ray_processes()}
    return {"results": results, "output": output, "left": left}


def _ray_processes() -> list[str]:
    """Command lines of live processes that belong to a Ray run of ours (its temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "/dev/shm/ray" in line:
            found.append(f"{entry.name}: {line[:200]}")
    return found


@pytest.mark.parametrize("case", CASES)
def test_ray_case(ray_run, case):
    results = ray_run["results"]
    if case not in results:
        pytest.fail(f"{case} did not run in the Ray namespace; its output:\n"
                    f"{ray_run['output'][-6000:]}", pytrace=False)
    if results[case] is not None:
        pytest.fail(f"{case} (in ray_cases.py) failed:\n{results[case][-6000:]}", pytrace=False)


def test_every_ray_case_is_reported(ray_run):
    assert sorted(ray_run["results"]) == sorted(CASES), ray_run["output"][-3000:]


def test_nothing_is_left_behind(ray_run):
    """No Ray process of the run is alive and /dev/shm holds nothing new afterwards."""
    assert ray_run["left"] == {"shm": [], "processes": []}
