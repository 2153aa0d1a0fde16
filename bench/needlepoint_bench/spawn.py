"""Child processes: each benchmark job runs `bench.worker` in a fresh process whose thread
environment is fixed before it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import paths


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    for var in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "RAYON_NUM_THREADS",
    ):
        env[var] = str(threads)
    env["OMP_WAIT_POLICY"] = "passive"
    env["NEEDLEPOINT_THREADS"] = str(threads)  # needlepoint.load(threads=...) default
    return env  # the child imports the installed needlepoint and needlepoint_bench


def run_child(spec: dict, threads: int, timeout: float, log) -> dict:
    with tempfile.TemporaryDirectory(prefix="needlepoint-bench-") as tmp:
        spec = dict(spec, out=str(Path(tmp) / "result.json"))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "needlepoint_bench.worker", str(spec_path)],
                cwd=paths.REPO_ROOT,
                env=child_env(threads),
                timeout=timeout,
                capture_output=True,
                text=True,
            )
        except subprocess.TimeoutExpired:
            return {"job_error": f"timed out after {timeout:.0f}s"}
        wall = time.perf_counter() - t0
        out = Path(spec["out"])
        if not out.is_file():
            tail = (proc.stderr or proc.stdout or "")[-2000:]
            return {"job_error": f"worker exited {proc.returncode} without a result: {tail}"}
        res = json.loads(out.read_text())
        res["child_wall_s"] = wall
        if proc.returncode != 0 or res.get("job_error"):
            log(f"  child problem: {res.get('job_error') or proc.returncode}")
        return res
