"""`needlepoint bench`: run the speed benchmark against needle-rs (`python -m bench`).

The benchmark lives in the repository's `bench/` folder, not in the installed package (it
needs `bench/requirements.txt`, which are not runtime dependencies), so this command works
from a source checkout installed with `pip install -e .`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import NeedlepointError

HELP = "benchmark against needle-rs (source checkout; writes docs/benchmarks.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "bench_args", nargs=argparse.REMAINDER, help="arguments for `python -m bench`"
    )


def _repo_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "bench" / "__init__.py").is_file() else None


def run(args: argparse.Namespace) -> int:
    root = _repo_root()
    if root is None:
        raise NeedlepointError(
            "the benchmark needs a source checkout (bench/ beside src/): "
            "clone the repository, `pip install -e . -r bench/requirements.txt`, then retry"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench import main as bench_main

    return int(bench_main(list(args.bench_args)))
