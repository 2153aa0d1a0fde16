"""Where the benchmarks find their inputs and write their outputs.

The benchmarks are run from a checkout of the repository (`needlepoint-bench ...` in its root):
their reports go to that checkout's `docs/` and `bench/results/`, so `REPO_ROOT` is the working
directory, not a path derived from where this package is installed (an installed package
reaches nothing outside itself; issue 27 item 6).

`shared_dir` is the one lookup of the `shared/` folder (fixtures, models): this package's
benchmarks and the test suite (`tests/conftest.py`) both call it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path.cwd()
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DOCS_DIR = REPO_ROOT / "docs"
DOCS_MD = DOCS_DIR / "benchmarks.md"
DOCS_PLOT = DOCS_DIR / "benchmarks_prefill.png"
DEFAULT_FIXTURE = "shipped"


def shared_candidates(root: Path) -> list[Path]:
    """Where `shared/` may be, in order: `$NEEDLEPOINT_SHARED`, else `shared/` beside the
    repository at `root`, else inside it (README "Set up")."""
    override = os.environ.get("NEEDLEPOINT_SHARED")
    return ([Path(override)] if override else []) + [root.parent / "shared", root / "shared"]


def shared_dir(root: Path = REPO_ROOT) -> Path:
    """The first candidate that holds `fixtures/`; FileNotFoundError naming them all."""
    candidates = shared_candidates(root)
    for candidate in candidates:
        if (candidate / "fixtures").is_dir():
            return candidate
    raise FileNotFoundError(
        "ground-truth fixtures not found: expected ../shared/fixtures next to the repository "
        f"(looked in {', '.join(str(c) for c in candidates)}); set NEEDLEPOINT_SHARED"
    )


def fixture_archive(name: str = DEFAULT_FIXTURE) -> Path:
    path = shared_dir() / "fixtures" / "needle3" / f"{name}.cact"
    if not path.is_file():
        raise FileNotFoundError(f"fixture archive missing: {path}")
    return path


def toy_model() -> Path:
    """The toy model beside the fixtures (`shared/models/needle3-toy.cact`)."""
    path = shared_dir() / "models" / "needle3-toy.cact"
    if not path.is_file():
        raise FileNotFoundError(f"toy model missing: {path}")
    return path


def rel(path: Path | str) -> str:
    """A path relative to the repository root when it lies inside it (for reports)."""
    p = Path(path).resolve()
    for base in (REPO_ROOT, REPO_ROOT.parent):
        try:
            return (
                str(p.relative_to(base)) if base == REPO_ROOT else "../" + str(p.relative_to(base))
            )
        except ValueError:
            continue
    return str(p)


def add_report_arguments(parser: Any, doc: str, record: str, what: str) -> None:
    """The report options a benchmark shares: `--out` (the markdown page under docs/),
    `--json` (the raw record under bench/results/) and `--report-only` (rewrite `what` of
    --out from --json, measuring nothing)."""
    parser.add_argument("--out", type=Path, default=DOCS_DIR / doc)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / record)
    parser.add_argument("--report-only", action="store_true",
                        help=f"rewrite {what} from --json, measuring nothing")
