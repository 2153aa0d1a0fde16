"""The `needlepoint` command line: a thin dispatcher over one module per subcommand.

Each subcommand lives in its own module exposing

* `HELP`: a one-line description for `needlepoint --help`;
* `add_arguments(parser)`: fill in the subcommand's `argparse` parser;
* `run(args) -> int`: do the work and return the exit status.

To add a subcommand (run, chat, eval, serve, bench, download, ...), write such a module and
add one line to `COMMANDS`. Keep heavy imports inside `run` so `--help` stays fast.

Errors a user can cause (a missing file, a malformed archive, bad input) print one line to
stderr and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ..errors import NeedlepointError
from ..version import __version__

# Subcommand name -> module (relative to this package). The one place to register commands.
COMMANDS: dict[str, str] = {
    "inspect": ".inspect",
    "run": ".run",
    "chat": ".chat",
    "eval": ".eval",
    "download": ".download",
    "serve": "..server.cli",
    "bench": ".bench",
}

EXIT_USAGE = 2  # bad input of any kind, as argparse uses for usage errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="needlepoint",
        description="Exact numpy inference engine for Cactus Needle tool-calling models.",
    )
    parser.add_argument("--version", action="version", version=f"needlepoint {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name, __package__)
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def _error(message: str) -> int:
    print(f"needlepoint: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `needlepoint` console script; returns the exit status."""
    parser = build_parser()
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
