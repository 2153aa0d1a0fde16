"""Markdown tables of `needlepoint-bench-bfcl --serve` results (docs/benchmarks_bfcl.md).

    python -m needlepoint_bench.bfcl_serve_report bench/results/bfcl_real.json \
        [--calibration bench/results/bfcl_calibration.json]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from .bfcl_serve import is_lost
from .tables import markdown_table


def lost(row: dict[str, Any]) -> bool:
    """A call lost at the token limit, recomputed (`is_lost`: results written before it
    counted a cut prose answer too)."""
    return is_lost(row["category"], row["mode"], row["finish"], row["calls"], row["text"])


def common_n(report: dict[str, Any]) -> dict[str, int]:
    """Per category: the number of cases every engine and mode answered (a run stopped
    early may have one more case in some of them)."""
    counts: dict[str, Counter] = {}
    for row in report["rows"]:
        counts.setdefault(row["category"], Counter())[(row["engine"], row["mode"])] += 1
    return {c: min(v.values()) for c, v in counts.items()}


def complete_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the first `common_n` cases of each category (file order is kept)."""
    n = common_n(report)
    seen: Counter = Counter()
    out = []
    for row in report["rows"]:
        key = (row["category"], row["engine"], row["mode"])
        seen[key] += 1
        if seen[key] <= n[row["category"]]:
            out.append(row)
    return out


def unparseable(row: dict[str, Any]) -> bool:
    """An answer that is not a well-formed call where one was required (a request the server
    refused with an error is counted apart, as refused)."""
    return bool(row["unparseable"]) and row["finish"] != "error"


def accuracy_table(rows: list[dict[str, Any]]) -> str:
    """Per category and mode: each engine's right/n, lost, unparseable, s/case."""
    groups: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    engines: list[str] = []
    for row in rows:
        groups.setdefault((row["category"], row["mode"]), {}).setdefault(
            row["engine"], []).append(row)
        if row["engine"] not in engines:
            engines.append(row["engine"])
    header = ["category", "mode", "n"]
    for e in engines:
        header += [f"{e} accuracy", f"{e} lost / unparseable / refused", f"{e} s/case"]
    if len(engines) == 2:
        header.append("difference (points)")
    lines = []
    for (category, mode), by in groups.items():
        n = len(next(iter(by.values())))
        line: list[Any] = [category, mode, n]
        acc = []
        for e in engines:
            group = by.get(e, [])
            right = sum(r["right"] for r in group)
            acc.append(right / len(group) if group else 0.0)
            line += [f"{right}/{len(group)} = {acc[-1]:.2f}",
                     f"{sum(lost(r) for r in group)} / {sum(unparseable(r) for r in group)} / "
                     f"{sum(r['finish'] == 'error' for r in group)}",
                     f"{sum(r['seconds'] for r in group) / max(len(group), 1):.1f}"]
        if len(engines) == 2:
            line.append(f"{100 * (acc[0] - acc[1]):+.0f}")
        lines.append(line)
    return "\n".join(markdown_table(header, lines))


def error_table(rows: list[dict[str, Any]]) -> str:
    """Wrong answers by BFCL error type, per engine and mode."""
    counts: Counter = Counter()
    columns: list[tuple[str, str]] = []
    for row in rows:
        key = (row["engine"], row["mode"])
        if key not in columns:
            columns.append(key)
        if not row["right"]:
            kind = row["error_type"] if row["error_type"] != "lost_at_token_limit" or lost(row) \
                else "prose cut at the token limit (no call begun)"
            counts[(kind, key)] += 1
    kinds = sorted({k for k, _ in counts}, key=lambda k: -sum(
        counts[(k, c)] for c in columns))
    header = ["BFCL error type", *[f"{e} {m}" for e, m in columns]]
    lines = [[k, *[counts[(k, c)] for c in columns]] for k in kinds]
    return "\n".join(markdown_table(header, lines))


def calibration_table(result: dict[str, Any]) -> str:
    lines = []
    for name, f in (("live_* (fit)", result["live"]), ("held-out", result["held_out"]),
                    *result["held_out_by"].items()):
        auroc = "n/a" if f["auroc"] is None else f"{f['auroc']:.3f}"
        lines.append([name, f["n"], f"{f['accuracy']:.3f}", f"{f['mean_raw']:.3f}",
                      f"{f['mean_calibrated']:.3f}", auroc, f"{f['ece_raw']:.3f}",
                      f"{f['ece_calibrated']:.3f}"])
    return "\n".join(markdown_table(
        ["answers", "n", "accuracy", "mean confidence raw", "mean calibrated", "AUROC",
         "ECE raw", "ECE calibrated"], lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--calibration", type=Path, default=None)
    args = parser.parse_args(argv)
    for path in args.results:
        report = json.loads(path.read_text(encoding="utf-8"))
        rows = complete_rows(report)
        print(f"{path}: N per category {common_n(report)}; load {report['load_before']} -> "
              f"{report.get('load_after')}; {report['machine']}\n")
        print(accuracy_table(rows) + "\n")
        print(error_table(rows) + "\n")
    if args.calibration is not None:
        print(calibration_table(json.loads(args.calibration.read_text(encoding="utf-8"))))


if __name__ == "__main__":
    main()
