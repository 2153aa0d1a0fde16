"""What the stages benchmarks (`stages.py`, `stages_recovery.py`) share: the shell script that
prepares the network namespace a Ray run goes in (loopback up, a private /dev/shm), and the
machine line of a report."""

from __future__ import annotations

import platform
from pathlib import Path

INSIDE = """set -e
ip link set lo up
mount -t tmpfs -o size=2g needlepoint-ray /dev/shm
export RAY_TMPDIR=/dev/shm/ray
mkdir -p "$RAY_TMPDIR"
exec "$@"
"""


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()
