"""Markdown tables of `needlepoint-bench-bfcl --out FILE` results (docs/benchmarks_bfcl.md).

    needlepoint-bench-bfcl-report bench/results/bfcl.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .tables import markdown_table


def is_malformed(answer: dict[str, Any]) -> bool:
    return answer["calls"] is None and (answer["error"] is not None
                                        or "<tool_call>" in answer["text"])


def table(report: dict[str, Any]) -> str:
    lines = []
    for result in report["categories"]:
        n, category = result["cases"], result["category"]
        for engine, s in result["summary"].items():
            rows = [row[engine] for row in result["rows"]]
            unparseable = 0 if "irrelevance" in category else sum(
                r["calls"] is None for r in rows)
            bad = sum(is_malformed(r) for r in rows)
            lines.append([category, n, engine, s["correct"], f"{s['correct'] / n:.0%}",
                         f"{unparseable / n:.0%}", f"{bad / n:.0%}", f"{s['seconds'] / n:.2f}"])
    return "\n".join(markdown_table(["category", "cases", "engine", "correct", "accuracy",
                                     "unparseable", "malformed", "s/case"], lines))


def main(argv: list[str] | None = None) -> int:
    """Print the table of each results file named on the command line."""
    names = sys.argv[1:] if argv is None else argv
    if not names:
        print("usage: needlepoint-bench-bfcl-report RESULTS.json ...", file=sys.stderr)
        return 2
    for name in names:
        data = json.loads(Path(name).read_text(encoding="utf-8"))
        print(f"{name}: load {data['load_before']} -> {data.get('load_after')}")
        print(table(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
