"""Merge `bfcl_serve` result files into one report: later files' rows replace earlier ones
for the same (case, engine, mode); every row says which run it came from (`run`: the file's
name) and the report lists the runs.

    python -m needlepoint_bench.bfcl_merge bench/results/bfcl_real.json new_forced.json \
        new_parallel.json --out bench/results/bfcl_real.json

Confidences are stored as raw evidence, as the calibration script fits and measures them: a
run made with a calibration other than the identity has its `confidence` and
`call_confidences` mapped back through it (`bfcl_calibration.raw_of`).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from .bfcl_calibration import raw_of
from .bfcl_serve import summarise

IDENTITY = {"slope": 1.0, "offset": 0.0}


def raw_rows(report: dict[str, Any], run: str) -> list[dict[str, Any]]:
    """The report's rows with raw confidences and their run's name."""
    used = report.get("calibration") or IDENTITY
    rows = []
    for row in report["rows"]:
        out = {**row, "run": row.get("run", run)}
        if row.get("confidence") is not None:
            out["confidence"] = raw_of(row["confidence"], used)
        if row.get("call_confidences"):
            out["call_confidences"] = [raw_of(c, used) for c in row["call_confidences"]]
        rows.append(out)
    return rows


def merge(reports: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One report of `reports` ((run name, report), earliest first)."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    runs = []
    for name, report in reports:
        for row in raw_rows(report, name):
            rows[(row["id"], row["engine"], row["mode"])] = row
        runs.extend(report.get("runs") or [{
            "run": name, "model": report.get("model"), "limit": report.get("limit"),
            "engines": report.get("engines"), "modes": report.get("modes"),
            "load_before": report.get("load_before"), "load_after": report.get("load_after"),
            "calibration": report.get("calibration") or IDENTITY}])
    first = reports[0][1]
    merged = list(rows.values())
    return {"model": first.get("model"), "threads": first.get("threads"),
            "engines": sorted({r["engine"] for r in merged}),
            "modes": sorted({r["mode"] for r in merged}), "limit": first.get("limit"),
            "machine": first.get("machine"), "calibration": IDENTITY, "runs": runs,
            # the first run's load at its start, the last run's at its end (each run's: runs)
            "load_before": first.get("load_before"),
            "load_after": reports[-1][1].get("load_after"),
            "rows": merged, "summary": summarise(merged)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", type=Path, nargs="+", help="earliest first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    reports = [(os.path.basename(p), json.loads(p.read_text(encoding="utf-8")))
               for p in args.reports]
    args.out.write_text(json.dumps(merge(reports), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
