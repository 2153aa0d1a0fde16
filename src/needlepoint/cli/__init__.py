"""The `needlepoint` command line's own subcommands (`main`), one module per subcommand; the
whole command, with `serve`, is `needlepoint.command.main`."""

from .main import COMMANDS, main

__all__ = ["COMMANDS", "main"]
