"""needlepoint vs needle-rs benchmark (`python -m bench`, or `needlepoint bench`).

Not part of the test suite and not a runtime dependency: its requirements are in
`bench/requirements.txt`. See `docs/benchmarks.md` (generated) for method and results.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with command-line style arguments; returns the exit status."""
    from .run import main as _main

    return _main(argv)


__all__ = ["main"]
