"""Orchestration: `needlepoint-bench [--quick] ...` (also `bench.main(argv)`).

The parent process never loads an engine. It builds the prompts (token ids), then starts
child processes (`bench.worker`), each with its thread environment fixed before start:

1. `load` jobs: fresh process per sample, engines alternating (rs, np, np-float, rs, ...):
   load time and first-call overhead (archive -> first-token-ready). needlepoint runs twice
   per sample with its weight cache in a fresh temp folder: cold (no cache file: weights
   built, the file written in the background), then warm (that file present).
2. `rss` jobs: one fresh process per engine running the RSS workload (longest prompt +
   new tokens); peak RSS is per process, so engines cannot share one. needlepoint: cold and
   warm, as for load.
3. `timing` jobs: one process per thread count; all engines loaded side by side and every
   workload repeated with the engines interleaved (rotating order), plus the memory
   bandwidth measured at the start and end of the same process.

Then it summarises (median and spread), writes the JSON under `bench/results/`, and
regenerates `docs/benchmarks.md` and `docs/benchmarks_prefill.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from . import paths
from .checks import consistency_checks
from .engines import ALL_ENGINES, NEEDLE_RS, NP_DEPLOY, cached
from .prompts import TOOL_PROMPT_NAME, build_prompts
from .spawn import run_child
from .stats import decode_vs_floor, describe_samples, floor_figures, ratios, summarise_timing

FULL = {
    "reps": 5,
    "lengths": [16, 64, 128, 256, 512],
    "new_tokens": 128,
    "threads": [1, 2],
    "load_reps": 5,
    "headline_lengths": [64, 512],
    "budget_s": 420.0,
}
QUICK = {
    "reps": 3,
    "lengths": [16, 64],
    "new_tokens": 32,
    "threads": [1],
    "load_reps": 3,
    "headline_lengths": [64],
    "budget_s": 90.0,
}
# Engines at thread counts above 1: the headline pair only (float is a side figure).
MULTI_THREAD_ENGINES = (NEEDLE_RS, NP_DEPLOY)
TARGETS = {  # figure -> (ratio direction, target); ratios are needlepoint / needle-rs (issue 11)
    "load": ("time", 1.5),
    "load_warm": ("time", 1.5),
    "prefill:len512": ("speed", 8.0),
    f"prefill:{TOOL_PROMPT_NAME}": ("speed", 8.0),
    "decode": ("speed", 2.5),
    "peak_rss": ("size", 1.25),
    "peak_rss_warm": ("size", 1.25),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="needlepoint-bench",
        description="Benchmark needlepoint against needle-rs on the same .cact archive.",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 3 reps, prompts of 16/64 tokens + the tool prompt, "
        "32 new tokens, 1 thread; writes bench/results/<fixture>-quick.json "
        "and leaves docs/ alone unless --docs",
    )
    ap.add_argument(
        "--fixture",
        default=paths.DEFAULT_FIXTURE,
        help="needle3 fixture name under shared/fixtures/needle3 (default shipped)",
    )
    ap.add_argument("--archive", type=Path, help="benchmark this .cact instead of a fixture")
    ap.add_argument("--reps", type=int, help="interleaved repetitions (default 5; quick 3)")
    ap.add_argument("--threads", help="comma list of thread counts (default 1,2; quick 1)")
    ap.add_argument("--lengths", help="comma list of prefill prompt lengths")
    ap.add_argument("--new-tokens", type=int, help="decode steps (default 128; quick 32)")
    ap.add_argument(
        "--engines", default=",".join(ALL_ENGINES), help=f"comma list from {', '.join(ALL_ENGINES)}"
    )
    ap.add_argument(
        "--no-peer",
        action="store_true",
        help="needlepoint's engines only (no needle-rs): what the smoke test runs",
    )
    ap.add_argument(
        "--max-call-s",
        type=float,
        default=120.0,
        help="stop repeating a workload for an engine once one call exceeds this",
    )
    ap.add_argument("--timeout", type=float, default=1500.0, help="per child process, seconds")
    ap.add_argument(
        "--budget-s",
        type=float,
        help="soft time budget of the timing phase, shared over the thread counts: no new "
        "repetition starts (beyond the first 3) once it would overrun (default 420; quick 90)",
    )
    ap.add_argument("--out", type=Path, help="results JSON path")
    docs = ap.add_mutually_exclusive_group()
    docs.add_argument(
        "--docs",
        dest="docs",
        action="store_true",
        default=None,
        help="write docs/benchmarks.md and the plot (default for full runs)",
    )
    docs.add_argument("--no-docs", dest="docs", action="store_false")
    ap.add_argument(
        "--report-only",
        type=Path,
        metavar="JSON",
        help="regenerate docs/benchmarks.md + plot from an existing results JSON",
    )
    ap.add_argument(
        "--before",
        type=Path,
        metavar="JSON",
        help="an earlier run's results to compare with on the page (default "
        "bench/results/<fixture>-before.json when it exists)",
    )
    return ap.parse_args(argv)


def _before(path: Path | None, results_path: Path) -> dict | None:
    """The earlier run the page compares with: `path`, else `<results stem>-before.json`."""
    path = path or results_path.with_name(f"{results_path.stem}-before.json")
    return json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from . import report

    if args.report_only:
        results = json.loads(args.report_only.read_text())
        report.write_docs(results, paths.DOCS_MD, paths.DOCS_PLOT,
                          _before(args.before, args.report_only))
        print(f"wrote {paths.rel(paths.DOCS_MD)} and {paths.rel(paths.DOCS_PLOT)}")
        return 0

    cfg = dict(QUICK if args.quick else FULL)
    if args.reps:
        cfg["reps"] = cfg["load_reps"] = max(1, args.reps)
    if args.threads:
        cfg["threads"] = [int(x) for x in args.threads.split(",")]
    if args.lengths:
        cfg["lengths"] = [int(x) for x in args.lengths.split(",")]
        cfg["headline_lengths"] = [n for n in cfg["headline_lengths"] if n in cfg["lengths"]]
    if args.new_tokens:
        cfg["new_tokens"] = args.new_tokens
    if args.budget_s:
        cfg["budget_s"] = args.budget_s
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.no_peer:
        engines = [e for e in engines if e != NEEDLE_RS]
    for e in engines:
        if e not in ALL_ENGINES:
            print(f"unknown engine {e!r}", file=sys.stderr)
            return 2
    archive = args.archive or paths.fixture_archive(args.fixture)
    tag = (args.archive.stem if args.archive else args.fixture) + ("-quick" if args.quick else "")
    out_json = args.out or paths.RESULTS_DIR / f"{tag}.json"
    write_docs = (not args.quick) if args.docs is None else args.docs

    def log(msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    t_start = time.perf_counter()
    from .machine import machine_info
    from .weights import decode_weight_bytes

    prompts, tok_source = build_prompts(archive, cfg["lengths"])
    by_name = {p.name: p for p in prompts}
    pj = [p.to_json() for p in prompts]
    tool = by_name[TOOL_PROMPT_NAME]
    longest = max(prompts, key=lambda p: p.length)
    shortest = min(prompts, key=lambda p: p.length)
    weights = decode_weight_bytes(archive)
    log(
        f"archive {archive} ({weights['file_bytes'] / 1e6:.1f} MB); prompts "
        + ", ".join(f"{p.name}={p.length}" for p in prompts)
        + f" via {tok_source}"
    )
    results: dict = {
        "schema": 1,
        "quick": args.quick,
        "archive": paths.rel(archive),
        "config": cfg,
        "engines": engines,
        "tokenizer_source": tok_source,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine_info(),
        "loadavg_start": os.getloadavg(),
        "prompts": [{k: v for k, v in p.items() if k != "ids"} for p in pj],
        "command": "needlepoint-bench"
        + (
            " " + " ".join(argv if argv is not None else sys.argv[1:])
            if (argv if argv is not None else sys.argv[1:])
            else ""
        ),
    }

    # needlepoint's tokenizer cost, which its prefill figures exclude (needle-rs's include it)
    try:
        from .prompts import make_encoder, render

        enc, _ = make_encoder(archive)  # a fresh tokenizer: its chunk cache is empty
        text = render(longest.query, longest.tools_json, longest.system)
        t0 = time.perf_counter()
        enc(text)
        results["tokenize_s_longest"] = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001
        results["tokenize_s_longest"] = f"{type(exc).__name__}: {exc}"

    # 1. load jobs: fresh process per sample, engines alternating
    log(f"load: {cfg['load_reps']} fresh processes per engine, prompt {shortest.name}")
    load_raw: dict = {e: [] for e in engines}
    for rep in range(cfg["load_reps"]):
        for e in engines[rep % len(engines) :] + engines[: rep % len(engines)]:
            spec = {
                "job": "load",
                "engine": e,
                "archive": str(archive),
                "threads": 1,
                "prompt": shortest.to_json(),
            }
            if e == NEEDLE_RS:
                load_raw[e].append(run_child(spec, 1, args.timeout, log))
                continue
            with tempfile.TemporaryDirectory(prefix="needlepoint-bench-cache-") as folder:
                spec["cache_dir"] = folder  # cold: empty folder; warm: the file cold wrote
                load_raw[e].append(run_child(spec, 1, args.timeout, log))
                warm = run_child(spec, 1, args.timeout, log)
                load_raw.setdefault(cached(e), []).append(warm)
    load_sum = {}
    for e, rs in load_raw.items():
        ok = [r for r in rs if r.get("available")]
        if ok:
            load_sum[e] = {
                k: describe_samples([r[k] for r in ok])
                for k in ("load_s", "cold_first_call_s", "warm_call_s", "load_to_ready_s")
            }
        else:
            load_sum[e] = None
            err = next((r.get("error") or r.get("job_error") for r in rs), None)
            log(f"  {e}: unavailable ({err})")
    results["load"] = {"summary": load_sum, "raw": load_raw}

    # 2. rss jobs: one fresh process per engine
    log(f"rss: {longest.name} + {cfg['new_tokens']} new tokens, one process per engine")
    rss = {}
    for e in engines:
        spec = {
            "job": "rss",
            "engine": e,
            "archive": str(archive),
            "threads": 1,
            "prompt": longest.to_json(),
            "new_tokens": cfg["new_tokens"],
        }
        if e == NEEDLE_RS:
            rss[e] = run_child(spec, 1, args.timeout, log)
        else:
            with tempfile.TemporaryDirectory(prefix="needlepoint-bench-cache-") as folder:
                spec["cache_dir"] = folder  # cold, then warm (as for load)
                rss[e] = run_child(spec, 1, args.timeout, log)
                rss[cached(e)] = run_child(spec, 1, args.timeout, log)
        for name in (e, cached(e)):
            if rss.get(name, {}).get("available"):
                log(f"  {name}: peak RSS {rss[name]['peak_rss_bytes'] / 2**20:.1f} MiB")
    results["rss"] = rss

    # 3. timing jobs, one per thread count
    timing_raw, timing_sum = {}, {}
    t_timing = time.perf_counter()
    headline = [f"len{n}" for n in cfg["headline_lengths"]] + [TOOL_PROMPT_NAME]
    for i, threads in enumerate(cfg["threads"]):
        left = cfg["budget_s"] - (time.perf_counter() - t_timing)
        # the 1-thread phase runs more engines and workloads: it gets twice the share
        shares = [2 if t == 1 else 1 for t in cfg["threads"][i:]]
        budget = max(left, 0.0) * shares[0] / sum(shares)
        eng_t = engines if threads == 1 else [e for e in engines if e in MULTI_THREAD_ENGINES]
        prefill = [p.name for p in prompts] if threads == 1 else headline
        log(
            f"timing, {threads} thread(s): {', '.join(eng_t)}; {cfg['reps']} reps of prefill "
            f"{', '.join(prefill)} and decode {cfg['new_tokens']} after {tool.name}"
        )
        spec = {
            "job": "timing",
            "archive": str(archive),
            "threads": threads,
            "engines": eng_t,
            "prompts": pj,
            "prefill": prefill,
            "decode_prompt": tool.name,
            "new_tokens": cfg["new_tokens"],
            "reps": cfg["reps"],
            "bandwidth": True,
            "max_call_s": args.max_call_s,
            "budget_s": budget,
            "min_reps": min(3, cfg["reps"]),
        }
        res = run_child(spec, threads, args.timeout, log)
        timing_raw[threads] = res
        if res.get("stopped_early"):
            log(f"  {res['stopped_early']}")
        timing_sum[threads] = summarise_timing(res)
        for name, e in timing_sum[threads].items():
            if not e["available"]:
                log(f"  {name}: unavailable ({e['error']})")
            for key, w in e["workloads"].items():
                log(
                    f"  {name:20s} {key:16s} {w['tok_s']['median']:9.1f} tok/s "
                    f"(spread {w['tok_s']['spread_pct']:.0f}%, n={w['tok_s']['n']})"
                )
    results["timing"] = {
        "raw": {str(k): v for k, v in timing_raw.items()},
        "summary": {str(k): v for k, v in timing_sum.items()},
    }
    floor = floor_figures(weights, timing_raw)
    results["floor"] = floor
    results["decode_vs_floor"] = decode_vs_floor(timing_sum, floor, rss)
    results["ratios"] = ratios(timing_sum, load_sum, rss, floor)
    results["targets"] = {k: {"direction": d, "target": t} for k, (d, t) in TARGETS.items()}
    results["checks"] = consistency_checks(results)
    results["loadavg_end"] = os.getloadavg()
    results["wall_s"] = time.perf_counter() - t_start

    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    log(f"wrote {paths.rel(out_json)} ({results['wall_s']:.0f}s)")
    if write_docs:
        report.write_docs(results, paths.DOCS_MD, paths.DOCS_PLOT,
                          _before(args.before, out_json))
        log(f"wrote {paths.rel(paths.DOCS_MD)} and {paths.rel(paths.DOCS_PLOT)}")
    print(report.headline_text(results))
    return 0
