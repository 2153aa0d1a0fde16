"""Shared helpers of the stage tests (`tests/stages/`): prompts, the single-process
references they are compared with, and the comparisons. Every expected value is computed by
the single-process model (`needlepoint.load(path)`), never recorded from a staged run."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, get_fixture

from needlepoint.errors import StageNonFiniteError

F32 = np.float32


def fixture_path(name: str):
    return get_fixture("needle3", name).cact


def long_prompt(name: str, count: int) -> np.ndarray:
    """`count` token ids: the fixture's prompts concatenated (repeated as needed)."""
    arrays = get_fixture("needle3", name).arrays
    parts = [arrays[k] for k in sorted(arrays.files) if k.endswith("_tokens")]
    ids = np.concatenate(parts)
    while len(ids) < count:
        ids = np.concatenate([ids, ids])
    return ids[:count].astype(np.int64)


def all_cut_sets(layers: int) -> list[list[int]]:
    """Every way to cut `layers` blocks into contiguous stages (2^(layers-1) of them)."""
    inner = range(1, layers)
    return [[0, *combo] for k in range(layers) for combo in itertools.combinations(inner, k)]


def stepped(session, ids: np.ndarray, first: int = 1) -> np.ndarray:
    """Logits after each of `ids`: a prefill of the first `first`, then one step each."""
    rows = [session.prefill(ids[:first])] if first == 1 else list(session.extend(ids[:first]))
    rows += [session.step(int(token)) for token in ids[first:]]
    return np.stack(rows)


def assert_bits(actual: np.ndarray, expected: np.ndarray, what: str = "logits") -> None:
    """Bit-identical (`np.array_equal`), with where they first differ when they do not."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if not np.array_equal(actual, expected):
        bad = np.argwhere(actual != expected)
        delta = float(np.max(np.abs(actual.astype(np.float64) - expected)))
        raise AssertionError(f"{what}: {len(bad)} values differ (first at {bad[0].tolist()}, "
                             f"max |delta| {delta:.3g})")


def assert_confidence(actual: float | None, expected: float | None) -> None:
    """The confidence logit pools in float32 with BLAS products (docs/numerics.md): it agrees
    across chunkings to float rounding, so to 1e-5 (relative) here."""
    assert (actual is None) == (expected is None)
    if expected is not None:
        assert np.isclose(actual, expected, rtol=1e-5, atol=1e-6), (actual, expected)


# -- Ray clusters in a loopback-only namespace (tests/stages/test_stages_ray*.py) ----------
INSIDE = """set -e
ip link set lo up
mount -t tmpfs -o size=2g needlepoint-ray /dev/shm
export RAY_TMPDIR="/dev/shm/ray-$NEEDLEPOINT_RAY_RUN"
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


def run_ray_cases(cases: Path, work: Path, timeout_s: float) -> dict:
    """Run the pytest module `cases` once inside a loopback-only namespace (Ray's processes
    and /dev/shm files die with it); per case its failure text (None: passed), the output,
    and what the run left behind (Ray processes, /dev/shm files)."""
    problem = _namespace_problem()
    if problem:
        pytest.fail(f"the Ray stage tests must run in a loopback-only network namespace, and "
                    f"{problem}", pytrace=False)
    report = work / "report.xml"
    command = [
        "unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", INSIDE,
        "inside",
        sys.executable, "-m", "pytest", str(cases), "-q",
        "-p", "no:cacheprovider", f"--basetemp={work / 'tmp'}", f"--junitxml={report}",
        "-o", "junit_family=xunit1", "-s",
    ]
    run = uuid.uuid4().hex[:8]  # names this run's Ray temp dir (other runs may be alive)
    env = dict(os.environ, NEEDLEPOINT_CACHE="0", RAY_USAGE_STATS_ENABLED="0",
               NEEDLEPOINT_RAY_RUN=run)
    shm_before = set(os.listdir("/dev/shm"))
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:  # the namespace (and Ray in it) dies with it
        output = f"timed out after {timeout_s} s\n{error.stdout or ''}{error.stderr or ''}"
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
            "processes": _ray_processes(run)}
    return {"results": results, "output": output, "left": left}


def _ray_processes(run: str) -> list[str]:
    """Command lines of live processes that belong to this Ray run (its temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"/dev/shm/ray-{run}" in line:
            found.append(f"{entry.name}: {line[:200]}")
    return found


def check_ray_case(ray_run: dict, case: str, cases_file: str) -> None:
    """One case of a `run_ray_cases` run, as a test: it fails with the run's output when the
    case did not run, with its own report when it failed (in `cases_file`)."""
    results = ray_run["results"]
    if case not in results:
        pytest.fail(f"{case} did not run in the Ray namespace; its output:\n"
                    f"{ray_run['output'][-6000:]}", pytrace=False)
    if results[case] is not None:
        pytest.fail(f"{case} (in {cases_file}) failed:\n{results[case][-6000:]}", pytrace=False)


def check_every_case_reported(ray_run: dict, cases: list[str]) -> None:
    """The run reported exactly `cases` (a case added to the file must be listed)."""
    assert sorted(ray_run["results"]) == sorted(cases), ray_run["output"][-3000:]


def check_nothing_left(ray_run: dict) -> None:
    """No Ray process of the run is alive and /dev/shm holds nothing new afterwards."""
    assert ray_run["left"] == {"shm": [], "processes": []}


def assert_non_finite_refused(staged, rows: int, at: tuple, value: float, match: str) -> None:
    """Activations with one non-finite `value` (at lanes[`at`], `rows` rows) sent straight to
    stage 1 of `staged` are refused there (a StageNonFiniteError naming stage 1, `match`)."""
    session = staged.session()
    cfg = staged.config
    lanes = np.zeros((rows, cfg.mhc_lanes, cfg.d_model), np.float32)
    lanes[at] = value
    with pytest.raises(StageNonFiniteError, match=match) as caught:
        staged.transport.call(1, "run", session.sid, 0, lanes, {}, "last")
    assert caught.value.stage == 1


def run_through_a_kill(pid: int, target, join_s: float) -> threading.Thread:
    """`target` run on a thread while stage process `pid` is stopped (SIGSTOP first, so the
    request is in flight on a stage that cannot answer when the kill comes: a fast machine
    finishes it within any fixed sleep), then killed; the thread, joined for `join_s`."""
    os.kill(pid, signal.SIGSTOP)
    worker = threading.Thread(target=target)
    worker.start()
    time.sleep(1.5)
    os.kill(pid, signal.SIGKILL)
    worker.join(join_s)
    return worker
