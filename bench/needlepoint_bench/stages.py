"""Stages benchmark: `needlepoint-bench-stages` -> docs/benchmarks_stages.md and
bench/results/stages.json.

Measures, on the shipped fixture's geometry (20 blocks, d 768) in deploy numerics: prefill
tokens/s and decode ms/token of one process and of K = 1, 2, 4 stages (in-process transport,
and Ray actors on a two-node cluster), the RSS of each stage process, and the latency of one
Ray hop (an actor call carrying a step's lanes, 12 KiB, or a 128-position chunk's, 1.5 MiB)
on the driver's node and on the other node.

Like the tests, the Ray part runs inside a network namespace with nothing but loopback
(`unshare --net --pid --fork --mount-proc`, root): the script re-executes itself there, and
every Ray process and /dev/shm file goes with the namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .paths import DOCS_DIR, REPO_ROOT, RESULTS_DIR, fixture_archive
from .sandbox import INSIDE, cpu_name
from .stages_pipeline import render_pipeline
from .tables import markdown_table

RESULTS = RESULTS_DIR / "stages.json"
REPORT = DOCS_DIR / "benchmarks_stages.md"
MB = 1 << 20


def _prompt(vocab: int, count: int) -> np.ndarray:
    return ((np.arange(1, count + 1) * 7919) % (vocab - 1) + 1).astype(np.int64)


def measure(model, prefill: int, decode: int) -> dict:
    """One round: prefill tokens/s of `prefill` tokens (a fresh session, chunks of 128),
    then decode ms/token over `decode` steps after it (the 20th percentile of the steps: on
    a shared machine other work only ever adds time)."""
    ids = _prompt(model.config.vocab, prefill + decode)
    session = model.session()
    start = time.perf_counter()
    session.prefill(ids[:prefill])
    tps = prefill / (time.perf_counter() - start)
    times = []
    for token in ids[prefill:]:
        start = time.perf_counter()
        session.step(int(token))
        times.append(time.perf_counter() - start)
    close = getattr(session, "close", None)
    if close:
        close()
    return {"prefill_tps": round(tps, 1),
            "decode_ms": round(float(np.percentile(times, 20)) * 1e3, 2)}


def best_of_rounds(models: dict, args) -> dict:
    """Every configuration measured once per round, rounds interleaved; the best round of
    each (highest prefill rate, lowest decode time)."""
    best: dict = {}
    for round_index in range(args.repeats):
        for name, staged in models.items():
            row = measure(staged, args.prefill, args.decode)
            print(f"round {round_index}", name, row, flush=True)
            old = best.setdefault(name, row)
            old["prefill_tps"] = max(old["prefill_tps"], row["prefill_tps"])
            old["decode_ms"] = min(old["decode_ms"], row["decode_ms"])
    return best


def hop_latency(ray, repeats: int = 40) -> dict:
    """Median ms of one actor call carrying `size` bytes (and returning 8), per node."""

    @ray.remote
    class Hop:
        def take(self, x):
            return x.nbytes

        def baseline_rss(self):  # a worker with what a stage imports, but no model
            from needlepoint.stages import rss_bytes  # what a stage imports, nothing more

            return rss_bytes()

    out = {}
    for node in ("node_a", "node_b"):
        actor = Hop.options(resources={node: 0.01}).remote()
        ray.get(actor.take.remote(np.zeros(1, np.float32)))
        for label, shape in (("step_12KiB", (1, 4, 768)), ("chunk_1.5MiB", (128, 4, 768))):
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                ray.get(actor.take.remote(x))
                times.append(time.perf_counter() - start)
            out[f"{node}/{label}"] = round(statistics.median(times) * 1e3, 3)
        out["baseline_rss_bytes"] = ray.get(actor.baseline_rss.remote())
        ray.kill(actor)
    return out


@contextlib.contextmanager
def two_node_ray(num_cpus: int) -> Iterator[Any]:
    """A local Ray cluster of two nodes (resources `node_a`, `node_b`) with `num_cpus` each,
    connected; `ray` while it lasts, shut down after."""
    import ray
    from ray.cluster_utils import Cluster

    node = dict(num_cpus=num_cpus, object_store_memory=128 * MB, node_ip_address="127.0.0.1")
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        node, resources={"node_a": 1}, include_dashboard=False))
    try:
        cluster.add_node(**node, resources={"node_b": 1})
        ray.init(address=cluster.address, log_to_driver=False)
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()


def inside_pipeline(args) -> dict:
    """Only the pipelining figures (`stages_pipeline.py`), on two one-CPU nodes."""
    os.environ.setdefault("NEEDLEPOINT_CACHE", "0")
    from .stages_pipeline import pipelined

    with two_node_ray(num_cpus=1):
        return {"pipeline": pipelined(args, fixture_archive())}


def inside(args) -> dict:
    """The measurements (run inside the namespace)."""
    os.environ.setdefault("NEEDLEPOINT_CACHE", "0")
    if args.only_pipeline:
        return inside_pipeline(args)
    import needlepoint
    from needlepoint.stages import load_staged

    results: dict = {"one_process": {}, "local": {}, "ray": {}, "rss": {}}
    models: dict = {"one": needlepoint.load(fixture_archive(), cache=False)}
    for k in (1, 2, 4):
        models[f"local/{k}"] = load_staged(fixture_archive(), k, cache=False)
    # 7 stage actors are alive at once (K = 1, 2, 4), each reserving one logical CPU
    with two_node_ray(num_cpus=4) as ray:
        try:
            _measure(ray, args, models, results)
        finally:
            for name, staged in models.items():
                if name != "one":
                    staged.close()
    return results


def _measure(ray: Any, args: argparse.Namespace, models: dict, results: dict) -> None:
    """Hop latency, Ray stage loading, the rounds, stage RSS and pipelining, into `results`."""
    from needlepoint.stages import load_staged

    results["hop_ms"] = hop_latency(ray)
    print("hops", results["hop_ms"], flush=True)
    for k in (1, 2, 4):
        placement = ["node_a" if i % 2 == 0 else "node_b" for i in range(k)]
        start = time.perf_counter()
        models[f"ray/{k}"] = load_staged(fixture_archive(), k, transport="ray",
                                         placement=placement, cache=False)
        results.setdefault("ray_load_s", {})[k] = round(time.perf_counter() - start, 2)
    best = best_of_rounds(models, args)
    results["one_process"] = best.pop("one")
    for name, row in best.items():
        transport, k = name.split("/")
        results[transport][int(k)] = row
    for k in (1, 2, 4):
        staged = models[f"ray/{k}"]
        results["rss"][k] = [
            {**{key: info[key] for key in ("stage", "first", "end", "rss_bytes",
                                           "archive_resident_bytes")},
             "record_bytes": share.weight_bytes}
            for info, share in zip(staged.stage_info(), staged.plan.ranges, strict=True)
        ]
    for name in [n for n in models if n.startswith("ray/")]:  # free the CPUs
        models.pop(name).close()
    from .stages_pipeline import pipelined

    results["pipeline"] = pipelined(args, fixture_archive())


def local_only(args) -> dict:
    """One process against local stages (K = 1, 2) on `--model`, no Ray and no network
    namespace: the benchmark's own side without the cluster (what the smoke test runs)."""
    import needlepoint

    path = args.model or fixture_archive()
    models: dict = {"one": needlepoint.load(path, cache=False)}
    try:
        for k in (1, 2):
            models[f"local/{k}"] = needlepoint.load(path, stages=k, cache=False)
        return {"model": str(path), "load_average": os.getloadavg(),
                "variant": needlepoint.native_variant(), **best_of_rounds(models, args)}
    finally:
        for name, model in models.items():
            if name != "one":
                model.close()


def _para(text: str) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), 90) + [""]


def _before_after(results: dict, before: dict | None) -> list[str]:
    """Prefill and decode of each configuration in an earlier run and in this one."""
    if not before:
        return []
    rows = []
    for transport in ("one_process", "local", "ray"):
        now, was = results.get(transport, {}), before.get(transport, {})
        pairs = [("-", now, was)] if transport == "one_process" else \
            [(k, now[k], was.get(k)) for k in now]
        for k, row, old in pairs:
            if not old:
                continue
            rows.append([transport.replace("_", " "), k,
                         f"{old['prefill_tps']:.0f} -> {row['prefill_tps']:.0f}",
                         f"{old['decode_ms']:.1f} -> {row['decode_ms']:.1f}"])
    lines = ["## Before and after", ""]
    lines += _para("Before: `bench/results/stages-before.json`, the results this page had "
                   f"before this run ({before.get('machine')}); "
                   "after: this page's run. Each is the best of its own rounds on a shared "
                   "machine, so only differences well beyond the rounds' spread mean anything.")
    lines += markdown_table(["run", "stages", "prefill tok/s", "decode ms/token"], rows,
                            align="lrrr")
    return lines + [""]


def render(results: dict, before: dict | None = None) -> str:
    one, hop = results["one_process"], results["hop_ms"]
    loads = ", ".join(f"K={k}: {v:.1f} s" for k, v in results["ray_load_s"].items())
    lines = ["# Stages benchmark", ""]
    lines += _para(
        "Generated by `needlepoint-bench-stages` (bench/needlepoint_bench/stages.py); raw "
        "numbers in "
        "`bench/results/stages.json`. Model: the shipped fixture's geometry (20 blocks, "
        "d_model 768, 35 MB archive), deploy numerics, 1 thread per process. Machine: "
        f"{results['machine']}, shared with other work while it ran. Every configuration is "
        f"measured once per round, {results['repeats']} rounds interleaved, and its best "
        f"round is kept: a prefill of {results['prefill']} tokens in chunks of 128 "
        f"(tokens/s), then decode ms/token (the 20th percentile of {results['decode']} "
        "steps). The Ray cluster is two nodes (two raylets and object stores) on this one "
        "machine, in a loopback-only network namespace; stage k runs on node_a for even k "
        "and on node_b for odd k; the driver (the head) is on node_a. Loading the Ray "
        f"stages (actors up, blocks prepared) took {loads}.")
    runs = [["one process", "-", f"{one['prefill_tps']:.0f}", f"{one['decode_ms']:.1f}",
             "1.00x"]]
    runs += [[transport, k, f"{row['prefill_tps']:.0f}", f"{row['decode_ms']:.1f}",
              f"{row['decode_ms'] / one['decode_ms']:.2f}x"]
             for transport in ("local", "ray") for k, row in results[transport].items()]
    lines += ["## Prefill and decode", ""]
    lines += markdown_table(["run", "stages", "prefill tok/s", "decode ms/token",
                             "decode vs one process"], runs, align="lrrrr")
    lines += [""]
    lines += _para(
        "The local transport runs every stage on a thread of this process: the products "
        "release the GIL, the rest of a block holds it, so on 2 cores it neither gains nor "
        "loses much. Ray stages are processes: a decode step pays K + 1 hops, and prefill "
        "gains from chunks in flight on several processes at once (4 stages on 2 cores).")
    lines += _before_after(results, before)
    lines += ["## One hop (a Ray actor call carrying the payload)", ""]
    lines += markdown_table(
        ["payload", "on the driver's node", "on the other node"],
        [[label.replace("_", " "), f"{hop[f'node_a/{label}']:.2f} ms",
          f"{hop[f'node_b/{label}']:.2f} ms"] for label in ("step_12KiB", "chunk_1.5MiB")],
        align="lrr")
    lines += ["", "## Memory per stage process (Ray, after the run)", ""]
    lines += _para(
        "RSS of each stage's actor process, the archive pages resident in it (the records it "
        "has read), and the archive bytes of its blocks' records (its share in the plan). An "
        "idle Ray worker that has imported needlepoint.stages holds "
        f"{hop['baseline_rss_bytes'] / MB:.0f} MiB.")
    lines += markdown_table(
        ["stages", "stage", "layers", "RSS", "archive pages resident", "its records"],
        [[k, row["stage"], f"{row['first']}-{row['end'] - 1}",
          f"{row['rss_bytes'] / MB:.0f} MiB", f"{row['archive_resident_bytes'] / MB:.1f} MiB",
          f"{row['record_bytes'] / MB:.1f} MiB"]
         for k, rows in results["rss"].items() for row in rows], align="rrlrrr")
    step_hop = hop["node_b/step_12KiB"]
    ten = one["decode_ms"] + 11 * step_hop
    lines += ["", "## What a 10-machine chain would cost per token", ""]
    lines += _para(
        "A decode step crosses K + 1 hops (head -> stage 0 -> ... -> stage K-1 -> head), each "
        "carrying one position's lanes (12 KiB), and runs the blocks in sequence: their "
        f"compute is the single process's ({one['decode_ms']:.1f} ms/token here for the 20 "
        f"blocks). With the cross-node hop measured here ({step_hop:.2f} ms), 10 stages on "
        f"10 machines cost about {one['decode_ms']:.1f} + 11 x {step_hop:.2f} = {ten:.1f} ms "
        "per token, plus the network's own latency per hop on a real LAN (typically 0.05-0.5 "
        "ms each). Prefill pipelines: with chunks in flight on every stage, its throughput "
        "is set by the slowest stage, not by the sum of the hops.")
    if results.get("pipeline"):
        lines += [""] + render_pipeline(results["pipeline"], " ".join(textwrap.wrap(
            f"Decode of {results.get('pipeline_steps', 24)} tokens after a "
            f"{results.get('pipeline_prompt', 64)}-token prompt; best of "
            f"{results.get('pipeline_repeats', results['repeats'])} interleaved rounds. "
            "`stages_pipeline.py` documents the method.", 10_000)))
        lines += _para(results.get("pipeline_note", ""))
    if REPORT.exists() and "## Recovery from a lost stage" in REPORT.read_text():
        # kept from `--recovery` runs (stages_recovery.py writes that section)
        kept = REPORT.read_text().split("## Recovery from a lost stage", 1)[1]
        lines += ["## Recovery from a lost stage" + kept.split("\n## ", 1)[0].rstrip("\n"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-stages", description=__doc__)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--decode", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only-pipeline", action="store_true",
                        help="measure only the pipelining figures (other sections are kept "
                        "from bench/results/stages.json)")
    parser.add_argument("--recovery", action="store_true",
                        help="measure only the recovery cost of a lost stage "
                        "(stages_recovery.py: kill to next token vs context length)")
    parser.add_argument("--pipeline-prompt", type=int, default=64)
    parser.add_argument("--pipeline-steps", type=int, default=24)
    parser.add_argument("--inside", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--local-only", action="store_true",
                        help="one process vs in-process stages only, no Ray (prints JSON, "
                        "writes nothing)")
    parser.add_argument("--model", type=Path, default=None,
                        help="with --local-only: the model (default the shipped fixture)")
    args = parser.parse_args(argv)
    if args.local_only:
        print(json.dumps(local_only(args), indent=1))
        return 0
    if args.inside:
        Path(args.inside).write_text(json.dumps(inside(args)))
        return 0
    if args.recovery:
        from .stages_recovery import main as recovery

        return recovery([])
    out = RESULTS.with_suffix(".partial.json")
    command = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh",
               "-c", INSIDE,
               "inside", sys.executable, "-m", "needlepoint_bench.stages", "--inside", str(out),
               "--prefill", str(args.prefill), "--decode", str(args.decode),
               "--repeats", str(args.repeats), "--pipeline-prompt", str(args.pipeline_prompt),
               "--pipeline-steps", str(args.pipeline_steps)]
    if args.only_pipeline:
        command.append("--only-pipeline")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=True)
    results = json.loads(out.read_text())
    out.unlink()
    measured = dict(pipeline_prompt=args.pipeline_prompt, pipeline_steps=args.pipeline_steps,
                    pipeline_repeats=args.repeats)
    if args.only_pipeline:
        results = {**json.loads(RESULTS.read_text()), **results, **measured}
    else:
        results.update(prefill=args.prefill, decode=args.decode, repeats=args.repeats,
                       machine=f"{cpu_name()}, {os.cpu_count()} cores, Python "
                               f"{platform.python_version()}, numpy {np.__version__}",
                       **measured)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    before = RESULTS.with_name("stages-before.json")
    REPORT.write_text(render(results, json.loads(before.read_text()) if before.exists()
                             else None))
    print(f"wrote {REPORT.relative_to(REPO_ROOT)} and {RESULTS.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
