"""Server defaults shared by the command line (`server/cli.py`) and the app (`server/app.py`)."""

from __future__ import annotations

import os

DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a 512-token context never needs more


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)
