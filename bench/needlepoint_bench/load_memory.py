"""The server's memory during the load benchmark's soak (`bench/load_phases.py`): RSS from
/proc every second, and every 10 s the C heap figures the server publishes on /metrics
(`needlepoint_heap_*`, glibc's `mallinfo2`: bytes in use vs held free) with the machine's
load average. Summarised as RSS at the start, after warm-up and at the end, and the slope of
a least-squares line through the last 40 minutes' samples (MiB per 10 minutes): a leak shows
as a slope in "heap in use" (or in Python objects), fragmentation as RSS rising with "free".
"""

from __future__ import annotations

import os
import re
from typing import Any

import httpx

WARMUP_S = 300.0  # RSS "after warm-up": the first sample at or after 5 minutes
SLOPE_WINDOW_S = 2400.0  # the slope is fitted over the last 40 minutes
_HEAP = re.compile(r"^needlepoint_heap_(in_use|free)_bytes (\S+)$", re.M)


async def heap_sample(http: httpx.AsyncClient, root: str) -> dict[str, float]:
    """{"in_use", "free"} in bytes from the server's /metrics at `root` ({} without them)."""
    response = await http.get(f"{root}/metrics")
    return {name: float(value) for name, value in _HEAP.findall(response.text)}


def slope_per_10min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per 600 s (None under 2 points)."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 600.0


def summary(rss: list[tuple[float, int]], samples: list[dict[str, float]]) -> dict[str, Any]:
    """RSS (MiB) at the start, after warm-up, at the end, and the last 40 minutes' slopes of
    RSS and heap in use; `rss` as (seconds since the start, bytes), `samples` every 10 s."""
    if not rss:
        return {}
    mib = [(t, v / 2**20) for t, v in rss]
    end = mib[-1][0]
    warm = next((v for t, v in mib if t >= WARMUP_S), None)
    tail = [(t, v) for t, v in mib if t >= end - SLOPE_WINDOW_S]
    heap = [(s["t"], s["in_use"] / 2**20) for s in samples
            if "in_use" in s and s["t"] >= end - SLOPE_WINDOW_S]
    return {"rss_start_mib": mib[0][1], "rss_after_warmup_mib": warm, "rss_end_mib": mib[-1][1],
            "slope_window_s": min(SLOPE_WINDOW_S, end - tail[0][0]),
            "rss_slope_mib_per_10min": slope_per_10min(tail),
            "heap_in_use_slope_mib_per_10min": slope_per_10min(heap)}


def loadavg() -> float:
    return os.getloadavg()[0]
