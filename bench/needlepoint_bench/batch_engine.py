"""The continuous-batching engine without HTTP (`python -m bench.batch_engine`; not a test).

Two measurements in one process, on the toy model and the shipped-geometry fixture:

* `model.run_batch` alone: the time of one decode step of N sessions together (one row each)
  against N = 1, i.e. the most any scheduler can gain from batching on this engine;
* the scheduler (`api/scheduler.py`): aggregate decode tokens/s of N threads looping text
  turns with a fixed `max_new_tokens` (as the load benchmark's clients do, minus HTTP),
  alternating 1 and N threads over a few rounds.

Prints one JSON object; `docs/benchmarks_server.md` quotes it by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from .paths import shared_dir


def step_costs(model: Any, sizes: list[int], reps: int) -> dict[int, float]:
    """Seconds of one `run_batch` decode step of n sessions (after a 20-token prefill)."""
    costs = {}
    for n in sizes:
        sessions = [model.session() for _ in range(n)]
        out = model.run_batch([(s, list(range(5, 25)), False) for s in sessions])
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            out = model.run_batch([(s, [int(o.argmax())], False)
                                   for s, o in zip(sessions, out, strict=True)])
            best = min(best, time.perf_counter() - t)
        costs[n] = best
    return costs


def scheduler_rate(model: Any, queries: list[str], threads: int, seconds: float,
                   max_new: int) -> float:
    import needlepoint
    from needlepoint.api.scheduler import Scheduler

    scheduler = Scheduler(model, max_sessions=threads)
    tokens = [0]
    stop = time.monotonic() + seconds

    def loop(k: int) -> None:
        i = k
        while time.monotonic() < stop:
            with scheduler.lease(wait=True) as lease:
                needle = needlepoint.Needle(tools=[], model=lease.model)
                envelope = needle.complete(queries[i % len(queries)], allow_call=False,
                                           max_new_tokens=max_new)
                tokens[0] += envelope["timings"]["decode_tokens"]
            i += threads

    began = time.monotonic()
    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - began
    scheduler.close()
    return tokens[0] / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_engine",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="toy,shipped")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per round and count")
    parser.add_argument("--max-new", type=int, default=32)
    args = parser.parse_args(argv)
    import needlepoint

    shared = shared_dir()
    paths = {"toy": shared / "models" / "needle3-toy.cact",
             "shipped": shared / "fixtures" / "needle3" / "shipped.cact"}
    eval_set = paths["toy"].with_name("needle3-toy.eval.jsonl")
    queries = [json.loads(line)["query"] for line in eval_set.read_text().splitlines()[:16]]
    out: dict[str, Any] = {"loadavg_start": os.getloadavg()[0]}
    for name in args.models.split(","):
        model = needlepoint.load(paths[name])
        reps = 10 if name == "toy" else 3
        costs = step_costs(model, [1, 4, args.clients, 2 * args.clients], reps)
        rounds = []
        for _ in range(args.rounds):
            one = scheduler_rate(model, queries, 1, args.seconds, args.max_new)
            many = scheduler_rate(model, queries, args.clients, args.seconds, args.max_new)
            rounds.append({"one": one, "many": many, "ratio": many / one})
        out[name] = {
            "step_ms": {n: round(c * 1000, 2) for n, c in costs.items()},
            "run_batch_gain": {n: round(n * costs[1] / c, 2) for n, c in costs.items()},
            "scheduler_rounds": rounds,
            "scheduler_ratio_median": sorted(r["ratio"] for r in rounds)[len(rounds) // 2],
        }
    out["loadavg_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
