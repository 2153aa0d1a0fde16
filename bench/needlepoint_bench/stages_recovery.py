"""Recovery cost of a lost stage (issue 30 item 4): `needlepoint-bench-stages --recovery` (or
`python -m needlepoint_bench.stages_recovery`) -> the "Recovery from a lost stage" section of
docs/benchmarks_stages.md and bench/results/stages_recovery.json.

The shipped Needle 3 geometry in deploy numerics, 2 Ray stages (node_a, node_b) of a
two-node loopback cluster (run inside the namespace `bench/stages.py` uses). Per context
length (128, 512, 2,048 tokens; 1 session) and sessions per stage (1, 2, 4 at 512 tokens):
that many sessions hold the context, stage 1's process is killed (`kill -9`), and the
time from the kill to the next token of one of them is measured (Ray notices the loss,
restarts the actor, which loads its blocks, the head replays every session's tokens through
the stages and re-issues the step: `stages/recovery.py`). Beside it: the re-prefill time
of the same tokens on the healthy stages, measured in the same run, and the target of the
issue: resumed within 2 s + that re-prefill time. The load average is recorded before and
after each point.

Replicas: aggregate decode tokens/s of 8 concurrent requests (each engine step one
`run_batch` of their 8 next tokens) on 2 stages with 1 replica vs 2 replicas over the two
nodes (replica 0: node_a, node_b; replica 1: node_b, node_a), in the same run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .paths import DOCS_DIR, REPO_ROOT, RESULTS_DIR, fixture_archive
from .sandbox import INSIDE, cpu_name

RESULTS = RESULTS_DIR / "stages_recovery.json"
REPORT = DOCS_DIR / "benchmarks_stages.md"
POINTS = ((128, 1), (512, 1), (2048, 1), (512, 2), (512, 4))  # (context, sessions)
REQUESTS, PROMPT, STEPS = 8, 64, 16  # the replicas' throughput
HEADING = "## Recovery from a lost stage"
MB = 1 << 20


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _prompt(vocab: int, count: int, seed: int) -> np.ndarray:
    return ((np.arange(1, count + 1) * (7919 + 31 * seed)) % (vocab - 7) + 5).astype(np.int64)


def point(staged, context: int, sessions: int) -> dict:
    """One measurement: `sessions` sessions at `context` tokens, stage 1 killed."""
    prompts = [_prompt(staged.config.vocab, context, k) for k in range(sessions)]
    live = [staged.session() for _ in prompts]
    start = time.perf_counter()
    for session, prompt in zip(live, prompts, strict=True):
        session.prefill(prompt, logits=False)
    prefill_s = time.perf_counter() - start  # what the replay re-runs, on healthy stages
    live[0].step(3)
    before = staged.stage_health()["replays"]
    load = _load()
    pid = staged.stage_info()[1]["pid"]
    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    live[0].step(4)
    resumed_s = time.perf_counter() - killed
    health = staged.stage_health()
    for session in live:
        session.close()
    return {"context": context, "sessions": sessions, "resumed_s": round(resumed_s, 2),
            "reprefill_s": round(prefill_s, 2), "recovery_s": health["last_recovery_s"],
            "replays": health["replays"] - before,
            "within_target": resumed_s <= 2.0 + prefill_s, "load": [load, _load()]}


def inside() -> dict:
    """The measurements (inside the namespace)."""
    os.environ.setdefault("NEEDLEPOINT_CACHE", "0")
    import ray
    from ray.cluster_utils import Cluster

    from needlepoint.stages import load_staged

    node = dict(num_cpus=2, object_store_memory=128 * MB, node_ip_address="127.0.0.1")
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        node, resources={"node_a": 1}, include_dashboard=False))
    rows = []
    try:
        cluster.add_node(**node, resources={"node_b": 1})
        ray.init(address=cluster.address, log_to_driver=False)
        model = fixture_archive("shipped")
        with load_staged(model, 2, transport="ray", placement=["node_a", "node_b"],
                         cache=False, max_stage_recoveries=100) as staged:
            for context, sessions in POINTS:
                rows.append(point(staged, context, sessions))
                print(rows[-1], flush=True)
        rates = {}
        for replicas, placement in ((1, ["node_a", "node_b"]),
                                    (2, ["node_a", "node_b", "node_b", "node_a"])):
            with load_staged(model, 2, transport="ray", placement=placement, cache=False,
                             replicas=replicas) as staged:
                rates[replicas] = throughput(staged)
                print("replicas", replicas, rates[replicas], flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return {"points": rows, "replicas": rates}


def throughput(staged, repeats: int = 2) -> dict:
    """Decode tokens/s of REQUESTS requests stepping together (best of `repeats`)."""
    best = 0.0
    load = _load()
    for _ in range(repeats):
        sessions = [staged.session() for _ in range(REQUESTS)]
        prompts = [_prompt(staged.config.vocab, PROMPT + STEPS, k) for k in range(REQUESTS)]
        staged.run_batch([(s, p[:PROMPT], False) for s, p in zip(sessions, prompts,
                                                                 strict=True)])
        start = time.perf_counter()
        for t in range(PROMPT, PROMPT + STEPS):
            staged.run_batch([(s, p[t:t + 1], False) for s, p in zip(sessions, prompts,
                                                                     strict=True)])
        best = max(best, REQUESTS * STEPS / (time.perf_counter() - start))
        for session in sessions:
            session.close()
    return {"tokens_per_s": round(best, 1), "load": [load, _load()]}


def render(results: dict) -> list[str]:
    lines = [HEADING, ""]
    lines += [" ".join(
        "Generated by `needlepoint-bench-stages --recovery` "
        "(bench/needlepoint_bench/stages_recovery.py); raw "
        "numbers in `bench/results/stages_recovery.json`. The shipped geometry in deploy "
        "numerics on 2 Ray stages (node_a, node_b), the sessions' contexts prefilled, then "
        "stage 1's process killed (`kill -9`) and one session stepped: **resumed** is the "
        "time from the kill to that token (Ray notices the loss, restarts the actor, which "
        "prepares its blocks, the head replays every session's tokens and re-issues the "
        "step); **re-prefill** is the prefill of the same tokens on the healthy stages, "
        "measured just before. Target (issue 30): resumed <= 2 s + re-prefill. Machine: "
        f"{results['machine']}, shared with other work; load average (1, 5, 15 min) before "
        "the kill and after the token.".split()), ""]
    lines += ["| context | sessions per stage | resumed | re-prefill | resumed - re-prefill "
              "| within target | load before / after |", "|---:|---:|---:|---:|---:|---|---|"]
    for row in results["points"]:
        extra = row["resumed_s"] - row["reprefill_s"]
        before, after = row["load"]
        lines.append(f"| {row['context']} | {row['sessions']} | {row['resumed_s']:.2f} s | "
                     f"{row['reprefill_s']:.2f} s | {extra:.2f} s | "
                     f"{'yes' if row['within_target'] else 'no'} | "
                     f"{before[0]:.1f} / {after[0]:.1f} |")
    extra = [row["resumed_s"] - row["reprefill_s"] for row in results["points"]]
    missed = [row for row in results["points"] if not row["within_target"]]
    lines += ["", " ".join((
        "Resumed minus re-prefill is what the recovery costs beyond re-running the tokens: Ray "
        "noticing the death, restarting the actor (a fresh worker process that imports "
        "needlepoint and prepares its blocks) and the hops; the replays of several sessions "
        "are pipelined through the stages, so they can take less than the sequential "
        f"re-prefill. In this run it was {min(extra):.2f} to {max(extra):.2f} s; "
        + (f"{len(missed)} point(s) missed the target (the re-prefill itself varies with the "
           "other work on the machine between the two measurements: see the load)."
           if missed else "every point met the target.")).split())]
    rates = results.get("replicas") or {}
    if rates:
        one, two = rates.get("1") or rates.get(1), rates.get("2") or rates.get(2)
        lines += ["", f"Replicas ({REQUESTS} concurrent requests, {STEPS} decode steps "
                  f"after a {PROMPT}-token prompt, each step one `run_batch`; 2 stages per "
                  "replica, best of 2 rounds):", "",
                  "| replicas | nodes | decode tokens/s | vs 1 replica | load before / after |",
                  "|---:|---:|---:|---:|---|"]
        for count, row in ((1, one), (2, two)):
            lines.append(f"| {count} | 2 | {row['tokens_per_s']:.1f} | "
                         f"{row['tokens_per_s'] / one['tokens_per_s']:.2f}x | "
                         f"{row['load'][0][0]:.1f} / {row['load'][1][0]:.1f} |")
        lines += ["", " ".join(
            "Here the two nodes share one machine's 2 cores: 2 replicas are 4 stage "
            "processes on the same cores, so they add no compute and cost hops and context "
            "switches; on machines of their own each replica brings its own cores, and a "
            "lost replica's sessions move to the other without waiting for a restart "
            "(tests/stages/ray_recovery_cases.py).".split())]
    return lines + [""]


def write_report(results: dict) -> None:
    """Replace (or append) this section of docs/benchmarks_stages.md."""
    text = REPORT.read_text() if REPORT.exists() else "# Stages benchmark\n"
    head, _, tail = text.partition(HEADING)
    rest = tail.split("\n## ", 1)[1] if "\n## " in tail else ""
    section = "\n".join(render(results))
    body = head.rstrip("\n") + "\n\n" + section + ("\n## " + rest if rest else "")
    REPORT.write_text(body.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--inside"]:
        Path(argv[1]).write_text(json.dumps(inside()))
        return 0
    out = RESULTS.with_suffix(".partial.json")
    command = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh",
               "-c", INSIDE, "inside", sys.executable, "-m", "needlepoint_bench.stages_recovery",
               "--inside", str(out)]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=True)
    results = json.loads(out.read_text())
    out.unlink()
    import platform

    import needlepoint

    results["machine"] = (f"{cpu_name()}, {os.cpu_count()} cores, Python "
                          f"{platform.python_version()}, numpy {np.__version__}, native "
                          f"kernels: {needlepoint.native_variant()} variant")
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    write_report(results)
    print(f"wrote {REPORT.relative_to(REPO_ROOT)} and {RESULTS.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
