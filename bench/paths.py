"""Where the benchmark finds its inputs and writes its outputs.

The archive is found the way the test suite finds its fixtures (`tests/conftest.py`):
`$NEEDLEPOINT_SHARED`, else `../shared` next to the repository, else `./shared`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DOCS_DIR = REPO_ROOT / "docs"
DOCS_MD = DOCS_DIR / "benchmarks.md"
DOCS_PLOT = DOCS_DIR / "benchmarks_prefill.png"
DEFAULT_FIXTURE = "shipped"


def ensure_src_on_path() -> None:
    """Benchmark the working tree's needlepoint, installed or not (src layout)."""
    src = str(REPO_ROOT / "src")
    if (REPO_ROOT / "src" / "needlepoint").is_dir() and src not in sys.path:
        sys.path.insert(0, src)


def shared_dir() -> Path:
    override = os.environ.get("NEEDLEPOINT_SHARED")
    candidates = [Path(override)] if override else []
    candidates += [REPO_ROOT.parent / "shared", REPO_ROOT / "shared"]
    for candidate in candidates:
        if (candidate / "fixtures").is_dir():
            return candidate
    raise FileNotFoundError(
        "benchmark fixtures not found: expected ../shared/fixtures next to the repository "
        f"(looked in {', '.join(str(c) for c in candidates)}); set NEEDLEPOINT_SHARED"
    )


def fixture_archive(name: str = DEFAULT_FIXTURE) -> Path:
    path = shared_dir() / "fixtures" / "needle3" / f"{name}.cact"
    if not path.is_file():
        raise FileNotFoundError(f"fixture archive missing: {path}")
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
