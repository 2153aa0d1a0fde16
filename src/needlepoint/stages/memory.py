"""What a stage process holds in memory (Linux `/proc`; 0 where it cannot be read)."""

from __future__ import annotations

import os


def rss_bytes() -> int:
    """Resident set size of this process (VmRSS)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def archive_resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of the archive file's mapping resident in this process (its `Rss` in smaps):
    the pages of the records this process has read."""
    target = os.path.realpath(path)
    total = 0
    inside = False
    try:
        with open("/proc/self/smaps") as handle:
            for line in handle:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line
                    fields = line.split(None, 5)
                    inside = len(fields) == 6 and fields[5].strip() == target
                elif inside and head == "Rss:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total
