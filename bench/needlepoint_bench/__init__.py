"""needlepoint's benchmarks, a package of their own (`needlepoint-bench`, bench/pyproject.toml).

A client of needlepoint: it imports only needlepoint's public, documented names (checked by
tests/test_architecture.py). Each benchmark is a console script (`needlepoint-bench` is the
speed comparison with needle-rs; `needlepoint-bench-speculate`, `-load`, `-hf`, `-bfcl`, ...),
run from the repository root, where it writes its report (docs/) and results (bench/results/).
Not a runtime dependency of needlepoint; `scripts/test` installs it for the smoke test.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the speed benchmark with command-line style arguments; returns the exit status."""
    from .run import main as _main

    return _main(argv)


__all__ = ["main"]
