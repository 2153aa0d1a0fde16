"""The `needlepoint` command: the subcommands of `cli/` plus `serve` from `server/`.

`cli/` and `server/` are the two front ends, side by side: neither imports the other. The
command line needs both, so it is put together here, one layer above them: a plain import
the layer test can see, where loading `serve` by module name from `cli/` would hide an upward
import. The `needlepoint` console script and `python -m needlepoint` run `main`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType

from .cli.main import COMMANDS as CLI_COMMANDS
from .cli.main import build_parser as cli_parser
from .cli.main import main as cli_main
from .server import cli as serve_command

COMMANDS: dict[str, ModuleType] = {**CLI_COMMANDS, "serve": serve_command}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand."""
    return cli_parser(COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `needlepoint` console script; returns the exit status."""
    return cli_main(argv, COMMANDS)
