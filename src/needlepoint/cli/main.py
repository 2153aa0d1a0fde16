"""The `needlepoint` command line: a thin dispatcher over one module per subcommand.

Each subcommand lives in its own module exposing

* `HELP`: a one-line description for `needlepoint --help`;
* `add_arguments(parser)`: fill in the subcommand's `argparse` parser;
* `run(args) -> int`: do the work and return the exit status.

To add a subcommand (run, chat, eval, download, ...), write such a module and add one
line to `COMMANDS`. Keep heavy imports inside `run` so `--help` stays fast.

`serve` is not here: it lives in `server/cli.py`, and `cli/` and `server/` are side by side
(neither imports the other). The whole command line, these subcommands plus `serve`, is put
together one layer above both, in `needlepoint/command.py`, which the `needlepoint` console
script and `python -m needlepoint` run (every import visible and downward).

Errors a user can cause (a missing file, a malformed archive, bad input) print one line to
stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

from ..errors import NeedlepointError
from ..version import __version__
from . import chat, download, inspect, run
from . import eval as evaluate

# Subcommand name -> module. The one place to register this folder's commands (`serve` is
# added by `needlepoint/command.py`).
COMMANDS: dict[str, ModuleType] = {
    "inspect": inspect,
    "run": run,
    "chat": chat,
    "eval": evaluate,
    "download": download,
}

EXIT_USAGE = 2  # bad input of any kind, as argparse uses for usage errors


def build_parser(commands: Mapping[str, ModuleType] = COMMANDS) -> argparse.ArgumentParser:
    """The parser of `commands` (name -> subcommand module)."""
    parser = argparse.ArgumentParser(
        prog="needlepoint",
        description="Exact numpy inference engine for Cactus Needle tool-calling models.",
    )
    parser.add_argument("--version", action="version", version=f"needlepoint {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in commands.items():
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def _error(message: str) -> int:
    print(f"needlepoint: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None,
         commands: Mapping[str, ModuleType] = COMMANDS) -> int:
    """Run one of `commands` as `argv` asks; returns the exit status (the `needlepoint`
    console script is `needlepoint.command.main`, these commands plus `serve`)."""
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except NeedlepointError as error:  # CactFormatError, TokenizerError, ModelInputError, ...
        return _error(" ".join(str(error).split()))
    except FileNotFoundError as error:
        return _error(f"no such file: {error.filename or error}")
    except IsADirectoryError as error:
        return _error(f"is a directory: {error.filename or error}")
    except PermissionError as error:
        return _error(f"permission denied: {error.filename or error}")
    except BrokenPipeError:  # e.g. `needlepoint inspect m.cact | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as error:
        return _error(str(error))
    except KeyboardInterrupt:
        return 130
