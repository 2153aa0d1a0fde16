"""Server defaults shared by the command line (`server/cli.py`) and the app (`server/app.py`)."""

from __future__ import annotations

import os

DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a 512-token context never needs more
# Continuous batching: requests decoded at once (live scheduler sessions) by default, and the
# cap on their KV caches, counted at full capacity (~0.5 MiB a session on the toy model,
# ~21 MiB at the released Needle 3 geometry).
DEFAULT_SESSIONS = 32
DEFAULT_MAX_KV_BYTES = 1 << 30
# A client that sends the headers and then stalls the body gets a 408 after this long (the
# whole body, not each piece: a slow drip does not keep the connection either).
DEFAULT_BODY_TIMEOUT_S = 30.0


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)
