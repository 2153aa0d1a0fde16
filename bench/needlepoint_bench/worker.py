"""Child-process side of the benchmark: `python -m needlepoint_bench.worker SPEC.json`.

Each job runs in a fresh interpreter whose thread environment the parent set before start
(`OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS`, `MKL_NUM_THREADS`, `RAYON_NUM_THREADS`,
`OMP_WAIT_POLICY=passive`); threadpoolctl pins the BLAS pools again here. Jobs:

* `timing`: load every engine once, then interleaved repetitions of every workload.
* `load`: one fresh-process load, a cold first call and a warm second call.
* `rss`: one engine loads and runs the RSS workload; reports peak RSS (`ru_maxrss`).

needlepoint's prepared-weight cache (`needlepoint.weight_cache`) is set per job from the spec
(`cache_dir`: on, in that folder; absent: off), so a benchmark never writes into ~/.cache
and a `load`/`rss` job measures either a cold load (empty folder: weights built, the cache
file written in the background) or a warm one (the file a previous job wrote).

The result is written as JSON to the spec's `out` path (stdout is left to the libraries).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

import numpy as np  # noqa: E402

from .engines import NEEDLE_RS, Unavailable, make_engine  # noqa: E402
from .prompts import Prompt  # noqa: E402


def _limit_threads(threads: int) -> dict:
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        # kept for the life of the process
        _limit_threads.handle = threadpool_limits(limits=threads)  # type: ignore[attr-defined]
        return {
            "threadpoolctl": [
                {k: d.get(k) for k in ("user_api", "internal_api", "num_threads", "version")}
                for d in threadpool_info()
            ]
        }
    except Exception as exc:  # noqa: BLE001
        return {"threadpoolctl": f"unavailable: {type(exc).__name__}: {exc}"}


def _vm(field: str) -> int | None:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _error(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _cache_env(spec: dict) -> None:
    """needlepoint's weight cache for this process: on in `spec["cache_dir"]`, else off."""
    folder = spec.get("cache_dir")
    os.environ["NEEDLEPOINT_CACHE"] = "1" if folder else "0"
    if folder:
        os.environ["NEEDLEPOINT_CACHE_DIR"] = folder


def _import_all() -> dict:
    """Import both engines' modules in every child, so every child starts from the same
    baseline RSS whichever engine it measures."""
    status = {}
    for mod in ("needle_rs", "needlepoint"):
        try:
            __import__(mod)
            status[mod] = "ok"
        except Exception as exc:  # noqa: BLE001
            status[mod] = _error(exc)
    return status


def job_timing(spec: dict) -> dict:
    from .machine import measure_bandwidth

    archive = Path(spec["archive"])
    threads = spec["threads"]
    _cache_env(spec)  # off: timing runs on weights built in this process
    prompts = {p["name"]: Prompt.from_json(p) for p in spec["prompts"]}
    prefill_names = spec["prefill"]
    decode_name = spec["decode_prompt"]
    n_new = spec["new_tokens"]
    max_call_s = spec.get("max_call_s", 120.0)
    out: dict = {"threads": threads, "env": _limit_threads(threads), "engines": {}}
    out["bandwidth_before"] = measure_bandwidth(threads) if spec.get("bandwidth") else None

    live = []
    warm = min(prompts.values(), key=lambda p: p.length)
    for name in spec["engines"]:
        eng = make_engine(name, archive)
        rec: dict = {"available": False}
        out["engines"][name] = rec
        try:
            rec["load_s"] = eng.load()
            eng.prefill(warm)  # warm-up: first-call costs are measured by the `load` job
            eng.decode(warm, 2)
            rec.update(available=True, describe=eng.describe(), samples={}, checks={})
            live.append(eng)
        except Unavailable as exc:
            rec["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001
            rec["error"] = _error(exc)

    workloads = [("prefill", n) for n in prefill_names] + [("decode", decode_name)]
    skipped: set[tuple[str, str]] = set()
    budget = spec.get("budget_s")
    t_start = time.perf_counter()
    out["loadavg_per_rep"] = []
    out["reps_completed"] = 0
    for rep in range(spec["reps"]):
        elapsed = time.perf_counter() - t_start
        if (
            budget is not None
            and rep >= spec.get("min_reps", 3)
            and elapsed * (rep + 1) / rep > budget
        ):
            out["stopped_early"] = (
                f"time budget {budget:.0f}s: {rep} repetitions took {elapsed:.0f}s, "
                "another would exceed it"
            )
            break
        out["loadavg_per_rep"].append(os.getloadavg())
        for kind, pname in workloads:
            p = prompts[pname]
            key = f"{kind}:{pname}"
            order = live[rep % len(live) :] + live[: rep % len(live)] if live else []
            for eng in order:
                if (eng.name, key) in skipped or eng not in live:
                    continue
                rec = out["engines"][eng.name]
                try:
                    r = eng.prefill(p) if kind == "prefill" else eng.decode(p, n_new)
                except Exception as exc:  # noqa: BLE001 - the engine is dropped, the run goes on
                    rec["error"] = f"{key}, rep {rep}: {_error(exc)}"
                    live.remove(eng)
                    continue
                s = rec["samples"].setdefault(key, {"seconds": [], "cpu_seconds": [], "tokens": []})
                s["seconds"].append(r["seconds"])
                s["cpu_seconds"].append(r["cpu_seconds"])
                s["tokens"].append(p.length if kind == "prefill" else r["steps"])
                c = rec["checks"].setdefault(key, {})
                c.setdefault("prompt_tokens", set()).add(r["prompt_tokens"])
                if kind == "prefill":
                    c.setdefault("first_token", set()).add(r["first_token"])
                else:
                    c.setdefault("tokens", r["tokens"])
                    c.setdefault("stop_reason", set()).add(r["stop_reason"])
                if r["seconds"] > max_call_s:
                    skipped.add((eng.name, key))
                    rec.setdefault("notes", []).append(
                        f"{key}: one call took {r['seconds']:.1f}s > {max_call_s}s; "
                        f"stopped after {len(s['seconds'])} repetition(s)"
                    )
        out["reps_completed"] = rep + 1
    for rec in out["engines"].values():
        for c in rec.get("checks", {}).values():
            for k, v in list(c.items()):
                if isinstance(v, set):
                    c[k] = sorted(v, key=str)
    for eng in live:  # where the decode step's time goes, and how many interpreter calls
        if hasattr(eng, "decode_profile"):
            try:
                out["engines"][eng.name]["decode_profile"] = eng.decode_profile(
                    prompts[decode_name])
            except Exception as exc:  # noqa: BLE001 - a figure is missing, the run goes on
                out["engines"][eng.name]["decode_profile"] = {"error": _error(exc)}
    out["bandwidth_after"] = measure_bandwidth(threads) if spec.get("bandwidth") else None
    return out


def job_load(spec: dict) -> dict:
    env = _limit_threads(spec["threads"])
    _cache_env(spec)
    imports = _import_all()
    p = Prompt.from_json(spec["prompt"])
    eng = make_engine(spec["engine"], Path(spec["archive"]))
    try:
        load_s = eng.load()
        t0 = time.perf_counter()
        eng.prefill(p)
        t1 = time.perf_counter()
        eng.prefill(p)
        t2 = time.perf_counter()
    except Unavailable as exc:
        return {"available": False, "error": str(exc), "imports": imports}
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "error": _error(exc), "imports": imports}
    cold, warm = t1 - t0, t2 - t1
    return {
        "available": True,
        "env": env,
        "imports": imports,
        "load_s": load_s,
        "cold_first_call_s": cold,
        "warm_call_s": warm,
        # archive -> first-token-ready: load() plus whatever the first call costs beyond
        # the steady state (lazy initialisation), not the prompt's own compute
        "load_to_ready_s": load_s + max(0.0, cold - warm),
        "prompt_tokens": p.length,
    }


def job_rss(spec: dict) -> dict:
    env = _limit_threads(spec["threads"])
    _cache_env(spec)
    imports = _import_all()
    p = Prompt.from_json(spec["prompt"])
    base_rss, base_peak = _vm("VmRSS"), _maxrss()
    eng = make_engine(spec["engine"], Path(spec["archive"]))
    try:
        eng.load()
        after_load_rss, after_load_peak = _vm("VmRSS"), _maxrss()
        r = eng.generate(p, spec["new_tokens"])
    except Unavailable as exc:
        return {"available": False, "error": str(exc), "imports": imports}
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "error": _error(exc), "imports": imports}
    res = {
        "available": True,
        "env": env,
        "imports": imports,
        "baseline_rss_bytes": base_rss,
        "baseline_peak_bytes": base_peak,
        "after_load_rss_bytes": after_load_rss,
        "after_load_peak_bytes": after_load_peak,
        "final_rss_bytes": _vm("VmRSS"),
        "peak_rss_bytes": _maxrss(),
        "workload": {
            "prompt_tokens": p.length,
            "new_tokens": spec["new_tokens"],
            "seconds": r["seconds"],
            "tokens": r["tokens"],
        },
    }
    res["peak_minus_baseline_bytes"] = res["peak_rss_bytes"] - (base_rss or 0)
    if spec["engine"] != NEEDLE_RS:
        from .weights import resident_array_bytes

        try:
            res["weights"] = resident_array_bytes(eng.model)
        except Exception as exc:  # noqa: BLE001
            res["weights"] = {"error": _error(exc)}
    return res


JOBS = {"timing": job_timing, "load": job_load, "rss": job_rss}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    np.random.seed(0)
    try:
        result = JOBS[spec["job"]](spec)
    except Exception as exc:  # noqa: BLE001 - report, never hide
        result = {"job_error": _error(exc), "traceback": traceback.format_exc()}
    Path(spec["out"]).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
