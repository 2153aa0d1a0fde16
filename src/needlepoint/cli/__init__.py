"""The `needlepoint` command line (`main`), one module per subcommand."""

from .main import COMMANDS, main

__all__ = ["COMMANDS", "main"]
