"""The worker pool, the one-pass step and thread scaling (issue 26 items 2 and 3):
`needlepoint-bench-pool`.

Deploy numerics on the shipped-geometry fixture, each measurement in a fresh process per
(tree, thread count) with its thread environment fixed before it starts (`spawn.child_env`),
the trees alternating, `--rounds` rounds, the fastest round of each figure kept (the machine
is shared: interference only ever slows a run):

* prefill of 99 and 512 token ids into a fresh session (wall and process CPU time);
* decode: 32 single-token steps after the 99-token prefill, ms per token;
* one `model.run_batch` decode step of 1 and of 16 sessions (after 20-token prefills): the
  one-pass step of many sessions against one.

`--before SRC` adds an earlier checkout (its `src/`, native library built in place) as a
second tree on the child's PYTHONPATH, so before and after are measured in the same run. The
page also carries `simd_streams`' answer to whether the two vCPUs run two SIMD streams at
once. Writes `bench/results/pool.json` and `docs/benchmarks_pool.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import paths
from .spawn import child_env
from .tables import markdown_table

PROMPTS = (99, 512)
DECODE_STEPS = 32
SESSIONS = 16


def _ids(count: int, salt: int = 0) -> list[int]:
    return [(i * 37 + salt * 101) % 1000 + 10 for i in range(count)]  # any vocab >= 1024


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _best(pairs: list[tuple[float, float]]) -> dict:
    wall, cpu = min(pairs)
    return {"wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3}


def measure(archive: str, threads: int) -> dict:
    """One child's figures (only public names of `needlepoint`)."""
    import needlepoint

    model = needlepoint.load(archive, threads=threads)
    variant = getattr(needlepoint, "native_variant", None)  # an older tree may lack it
    out: dict = {"variant": variant() if variant else "not reported by this tree",
                 "threads": threads}
    for length in PROMPTS:
        ids = _ids(length)
        runs = [_timed(lambda ids=ids: model.session().prefill(ids)) for _ in range(3)]
        out[f"prefill_{length}"] = _best(runs)
    steps = []
    for _ in range(2):
        session = model.session()
        session.prefill(_ids(PROMPTS[0]))

        def decode(session=session) -> None:
            token = 7
            for _ in range(DECODE_STEPS):
                token = int(session.step(token).argmax())
        steps.append(_timed(decode))
    best = _best(steps)
    out["decode_token"] = {key: value / DECODE_STEPS for key, value in best.items()}
    for count in (1, SESSIONS):
        sessions = [model.session() for _ in range(count)]
        rows = model.run_batch([(s, _ids(20, i), False) for i, s in enumerate(sessions)])
        runs = []
        for _ in range(8):
            requests = [(s, [int(r.argmax())], False) for s, r in zip(sessions, rows,
                                                                    strict=True)]
            wall, cpu = time.perf_counter(), time.process_time()
            rows = model.run_batch(requests)
            runs.append((time.perf_counter() - wall, time.process_time() - cpu))
        out[f"step_{count}"] = dict(_best(runs), rows=len(rows))  # rows: one per session
    return out


def _child(archive: Path, threads: int, src: Path | None) -> dict:
    env = child_env(threads)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "needlepoint_bench.pool", "--child",
                           str(archive), str(threads)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=paths.REPO_ROOT)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _simd_streams(seconds: float) -> str:
    proc = subprocess.run([sys.executable, "-m", "needlepoint_bench.simd_streams",
                           "--seconds", str(seconds)],
                          capture_output=True, text=True, timeout=300)
    return proc.stdout.strip() if proc.returncode == 0 else f"did not run: {proc.stderr[-300:]}"


def _merge(runs: list[dict]) -> dict:
    """The fastest round of each figure."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return runs[0] if runs else {}
    merged = dict(good[0])
    for key, value in good[0].items():
        if isinstance(value, dict):
            merged[key] = min((run[key] for run in good), key=lambda v: v["wall_ms"])
    return merged


FIGURES = (("prefill_99", "prefill, 99 ids (ms)"), ("prefill_512", "prefill, 512 ids (ms)"),
           ("decode_token", "decode, ms per token"), ("step_1", "run_batch step, 1 session (ms)"),
           (f"step_{SESSIONS}", f"run_batch step, {SESSIONS} sessions (ms)"))


def _cell(record: dict, key: str) -> str:
    value = record.get(key)
    return f"{value['wall_ms']:.2f} (CPU {value['cpu_ms']:.2f})" if value else "—"


def write_page(result: dict, path: Path) -> None:
    trees = list(result["trees"])
    L = ["# The worker pool, the one-pass step and threads (`needlepoint-bench-pool`)", "",
         f"_Generated on {result['started']} in {result['wall_s']:.0f} s; load average "
         f"{result['loadavg_start']:.2f} at start, {result['loadavg_end']:.2f} at end. Method: "
         "the module doc of `bench/needlepoint_bench/pool.py` (deploy numerics, "
         f"`{Path(result['archive']).name}`, a fresh process per tree and thread count, fastest of "
         f"{result['rounds']} rounds)._", ""]
    for name in trees:
        runs = result["trees"][name]
        L.append(f"* **{name}**: {runs['label']}; native variant "
                 f"{runs['by_threads'].get('1', {}).get('variant', '?')}.")
    L += ["", "## Figures (wall ms, process CPU ms in parentheses)", ""]
    rows = []
    for key, label in FIGURES:
        for threads in result["threads"]:
            rows.append([label, str(threads)] + [
                _cell(result["trees"][name]["by_threads"].get(str(threads), {}), key)
                for name in trees])
    L += markdown_table(["figure", "threads", *trees], rows)
    L += ["", "## Derived", ""]
    rows = []
    for name in trees:
        by = result["trees"][name]["by_threads"]
        one, two = by.get("1", {}), by.get("2", {})
        if "step_1" in one and f"step_{SESSIONS}" in one:
            gain = SESSIONS * one["step_1"]["wall_ms"] / one[f"step_{SESSIONS}"]["wall_ms"]
            gain_cpu = SESSIONS * one["step_1"]["cpu_ms"] / one[f"step_{SESSIONS}"]["cpu_ms"]
            rows.append([name, f"{SESSIONS} sessions' step vs {SESSIONS} single steps, "
                         "1 thread", f"{gain:.2f}x (CPU {gain_cpu:.2f}x)", "≥ 1.5x"])
        for key, label, target in (("prefill_512", "prefill 512, 2 threads vs 1", "≥ 1.5x"),
                                   ("prefill_99", "prefill 99, 2 threads vs 1", "≥ 1.5x"),
                                   ("decode_token", "decode, 2 threads vs 1", "≥ 1.0x")):
            if key in one and key in two:
                rows.append([name, label,
                             f"{one[key]['wall_ms'] / two[key]['wall_ms']:.2f}x", target])
    L += markdown_table(["tree", "speed-up", "measured", "target"], rows)
    L += ["", "## Does this VM run two SIMD streams at once? "
          "(`python -m needlepoint_bench.simd_streams`)", "", "```", result["simd_streams"],
          "```", ""]
    path.write_text("\n".join(L))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-pool",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("ARCHIVE", "THREADS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--before", type=Path, metavar="SRC",
                        help="an earlier checkout's src/ (native library built in place)")
    parser.add_argument("--before-label", default="before")
    parser.add_argument("--archive", type=Path, help="default: the shipped-geometry fixture")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--simd-seconds", type=float, default=1.0)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--out", type=Path, default=paths.DOCS_DIR / "benchmarks_pool.md")
    parser.add_argument("--json", type=Path, default=paths.RESULTS_DIR / "pool.json")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]))))
        return 0
    archive = args.archive or paths.shared_dir() / "fixtures" / "needle3" / "shipped.cact"
    threads = [int(t) for t in args.threads.split(",")]
    trees = {"after": (None, "this checkout")}
    if args.before is not None:
        trees = {args.before_label: (args.before.resolve(), f"`{args.before}`"), **trees}
    began, started = time.perf_counter(), time.strftime("%Y-%m-%d %H:%M:%S %z")
    load_start = os.getloadavg()[0]
    runs: dict = {name: {str(t): [] for t in threads} for name in trees}
    for _ in range(args.rounds):
        for t in threads:
            for name, (src, _) in trees.items():
                runs[name][str(t)].append(_child(archive, t, src))
                print(f"[pool] {name} t{t}: {runs[name][str(t)][-1]}", flush=True)
    result = {"started": started, "rounds": args.rounds, "archive": str(archive),
              "threads": threads, "loadavg_start": load_start,
              "trees": {name: {"label": label, "by_threads": {
                  t: _merge(r) for t, r in runs[name].items()}, "rounds": runs[name]}
                  for name, (_, label) in trees.items()}}
    result["simd_streams"] = _simd_streams(args.simd_seconds)
    result["loadavg_end"] = os.getloadavg()[0]
    result["wall_s"] = time.perf_counter() - began
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    write_page(result, args.out)
    print(f"wrote {paths.rel(args.out)} and {paths.rel(args.json)}")
    failed = [run for tree in runs.values() for rounds in tree.values() for run in rounds
              if "error" in run]
    if failed:
        print(f"{len(failed)} measurement(s) failed: {failed[0]['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
