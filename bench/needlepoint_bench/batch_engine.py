"""The continuous-batching engine without HTTP (`needlepoint-bench-batch-engine`).

Two measurements in one process, on the toy model and the shipped-geometry fixture:

* `model.run_batch` alone: the time of one decode step of N sessions together (one row each)
  against N = 1, i.e. the most any scheduler can gain from batching on this engine;
* the scheduler, through its public entry `Needle.complete_many`: aggregate decode tokens/s
  of batches of N text turns with a fixed `max_new_tokens` (as the load benchmark's clients
  send them, minus HTTP), alternating 1 and N at once over a few rounds.

Prints one JSON object; `docs/benchmarks_server.md` quotes it by hand.
"""

from __future__ import annotations

import argparse
import json
import os
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


def scheduler_rate(model: Any, queries: list[str], clients: int, seconds: float,
                   max_new: int) -> float:
    """Decode tokens/s of `Needle.complete_many` (the public entry to the scheduler) with
    `clients` sessions decoding at once, text turns of `max_new_tokens`, for `seconds`."""
    import needlepoint

    needle = needlepoint.Needle(tools=[], model=model, cache=None)
    tokens, began = 0, time.monotonic()
    stop = began + seconds
    start = 0
    while time.monotonic() < stop:
        batch = [queries[(start + i) % len(queries)] for i in range(clients)]
        start += clients
        envelopes = needle.complete_many(batch, max_sessions=clients, allow_call=False,
                                         max_new_tokens=max_new)
        tokens += sum(e["timings"]["decode_tokens"] for e in envelopes)
    return tokens / (time.monotonic() - began)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-batch-engine",
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
