"""The machine's floor (memory bandwidth measured in the run) and a description of the box."""

from __future__ import annotations

import os
import platform
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from .paths import REPO_ROOT


def _timed_parallel(fn, parts: list, threads: int) -> float:
    """Wall seconds to run fn over each part, `threads` Python threads (numpy drops the GIL)."""
    if threads <= 1:
        t0 = time.perf_counter()
        for p in parts:
            fn(p)
        return time.perf_counter() - t0
    ts = [
        threading.Thread(target=lambda ch=ch: [fn(p) for p in ch])
        for ch in (parts[i::threads] for i in range(threads))
    ]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def measure_bandwidth(
    threads: int = 1, big_bytes: int = 512 << 20, small_bytes: int = 16 << 20, reps: int = 7
) -> dict:
    """Streaming bandwidth in GB/s (1e9 bytes/s).

    * `read`: `sum` over a float64 buffer of `big_bytes` (>> any cache): what streaming
      weights from DRAM can reach. Split into `threads` slices run by that many threads.
    * `copy`: `copyto` between two such buffers, counted as read + write bytes.
    * `read_cache`: `sum` over a `small_bytes` buffer repeated (it stays in the last-level
      cache when that is larger; size it like the decode weights to see whether they could
      be served from cache).
    Buffers are written before timing (first-touch page faults would dominate otherwise).
    Reported: median and best over `reps`.
    """
    n = big_bytes // 8
    a = np.ones(n)
    b = np.full(n, 2.0)  # written now, so no page faults inside the timed copies
    a_parts = np.array_split(a, max(threads, 1) * 4)
    pairs = list(zip(np.array_split(b, max(threads, 1) * 4), a_parts, strict=True))
    small = np.ones(max(small_bytes // 8, 1))
    s_parts = np.array_split(small, max(threads, 1))
    inner = max(1, int((256 << 20) // max(small.nbytes, 1)))

    def stats(xs: list[float]) -> dict:
        return {
            "median": float(np.median(xs)),
            "best": float(np.max(xs)),
            "all": [round(x, 2) for x in xs],
        }

    read, copy, cache = [], [], []
    _timed_parallel(np.sum, a_parts, threads)  # warm
    for _ in range(reps):
        read.append(a.nbytes / _timed_parallel(np.sum, a_parts, threads) / 1e9)
        dt = _timed_parallel(lambda p: np.copyto(p[0], p[1]), pairs, threads)
        copy.append(2 * a.nbytes / dt / 1e9)
        dt = _timed_parallel(lambda p: [np.sum(p) for _ in range(inner)], s_parts, threads)
        cache.append(inner * small.nbytes / dt / 1e9)
    return {
        "threads": threads,
        "big_buffer_bytes": int(a.nbytes),
        "small_buffer_bytes": int(small.nbytes),
        "read_GBps": stats(read),
        "copy_GBps": stats(copy),
        "read_cache_GBps": stats(cache),
    }


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def machine_info() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    caches = {}
    for idx in range(5):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{idx}"
        level, kind, size = _read(f"{base}/level"), _read(f"{base}/type"), _read(f"{base}/size")
        if level and size:
            caches[f"L{level}{'' if kind == 'Unified' else kind[0].lower()}"] = size
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    info = {
        "cpu": cpu or platform.processor(),
        "logical_cpus": os.cpu_count(),
        "caches": caches,
        "memory": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [
            f"{d.get('internal_api')} {d.get('version')} ({d.get('architecture')})"
            for d in threadpool_info()
        ]
    except Exception as exc:  # noqa: BLE001
        info["blas"] = f"threadpoolctl unavailable: {exc}"
    try:  # which native kernels ran (every report names the variant)
        import needlepoint

        info["native_variant"] = needlepoint.native_variant()
    except Exception as exc:  # noqa: BLE001
        info["native_variant"] = f"unknown ({exc})"
    from importlib import metadata

    for dist in ("needle-rs", "needlepoint", "threadpoolctl", "matplotlib"):
        try:
            info[f"{dist}_version"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[f"{dist}_version"] = None
    try:  # read-only: which tree was benchmarked
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        info["git"] = head + (" + uncommitted changes in src/" if dirty else "")
    except Exception:  # noqa: BLE001
        info["git"] = None
    return info
