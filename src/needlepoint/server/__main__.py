"""`python -m needlepoint.server --model M`: the server without the package CLI."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
