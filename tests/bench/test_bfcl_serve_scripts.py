"""The BFCL report scripts of `needlepoint-bench-bfcl --serve` on the results committed in
bench/results/: the calibration script refits the shipped Platt map from the live_* answers
alone (docs/benchmarks_bfcl.md), and the report tables every engine and mode of the run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO_ROOT
from test_bench_smoke import script

from needlepoint import CALIBRATION

RESULTS = REPO_ROOT / "bench" / "results"


def test_the_calibration_script_refits_the_shipped_map(tmp_path: Path) -> None:
    out = tmp_path / "calibration.json"
    done = subprocess.run([script("needlepoint-bench-bfcl-calibration"),
                           str(RESULTS / "bfcl_real_live.json"), str(RESULTS / "bfcl_real.json"),
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    fitted = json.loads(out.read_text())
    assert (fitted["slope"], fitted["offset"]) == (CALIBRATION.slope, CALIBRATION.offset)
    assert fitted["live"]["n"] > 0 and fitted["held_out"]["n"] > 0
    assert f"slope={CALIBRATION.slope} offset={CALIBRATION.offset}" in done.stdout


def test_the_serve_report_tables_both_engines(tmp_path: Path) -> None:
    done = subprocess.run([script("needlepoint-bench-bfcl-serve-report"),
                           str(RESULTS / "bfcl_real.json"), "--calibration",
                           str(RESULTS / "bfcl_calibration.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for word in ("needlepoint", "llama.cpp", "simple_python", "irrelevance", "forced", "auto"):
        assert word in done.stdout, word
