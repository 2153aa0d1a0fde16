"""Load benchmark of `needlepoint serve` (`needlepoint-bench-load`; not a test).

Starts the server as a subprocess on 127.0.0.1 (loopback only) and drives it with the
official `openai` async client, in three phases (`bench/load_phases.py`):

* scaling: aggregate decode tokens/s with 16 concurrent clients vs one client, text requests
  with a fixed `max_tokens` (target: >= 4x);
* ttft: p50 time to the first token of a new tool-calling request (streamed, `max_tokens`
  1) while 15 others decode, vs alone (target: <= 2x);
* soak: 64 clients for 60 s on tool-calling requests from the toy model's eval set (a quarter
  streamed), every answer compared with the answer the same request got alone (greedy), so
  cross-talk shows up as "wrong answers"; errors by kind, latencies, RSS every second
  (target: 0 errors, 0 wrong answers, flat RSS).

`--model toy` (default: the trained demo model) or `shipped` (the shipped-geometry Needle 3
fixture, random weights: use it for the scaling and ttft phases) or a path. Each run writes
`bench/results/load_<label>.json`; `docs/benchmarks_server.md` is regenerated from every
result file there (the hand-written notes after its `<!-- notes -->` line are kept).
Everything is bounded: phases stop at their deadline, and requests still running then get at
most `--timeout` seconds to finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import openai

from .load_phases import scaling, soak, ttft
from .load_report import write_report
from .load_server import Server, health, proc_status
from .machine import machine_info
from .paths import REPO_ROOT, RESULTS_DIR, shared_dir

OUT = REPO_ROOT / "docs" / "benchmarks_server.md"
PHASES = ("scaling", "ttft", "soak")


def model_path(name: str) -> Path:
    if name == "toy":
        return shared_dir() / "models" / "needle3-toy.cact"
    if name == "shipped":
        return shared_dir() / "fixtures" / "needle3" / "shipped.cact"
    return Path(name)


def load_requests(limit: int) -> list[dict[str, Any]]:
    eval_set = model_path("toy").with_name("needle3-toy.eval.jsonl")
    rows = [json.loads(line) for line in eval_set.read_text().splitlines()[:limit]]
    return [
        {
            "messages": [{"role": "user", "content": row["query"]}],
            "tools": [{"type": "function", "function": tool} for tool in row["tools"]],
        }
        for row in rows
    ]


def short_queries(count: int = 16) -> list[str]:
    eval_set = model_path("toy").with_name("needle3-toy.eval.jsonl")
    return [json.loads(line)["query"] for line in eval_set.read_text().splitlines()[:count]]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = Server(args)
    client = openai.AsyncOpenAI(
        base_url=server.base_url, api_key="-", max_retries=0, timeout=args.timeout
    )
    result: dict[str, Any] = {"phases": {}}
    try:
        await server.wait_ready(client)
        model = (await client.models.list()).data[0].id
        state = await health(client)
        result.update(model=model, rss_after_load_mib=(server.rss() or 0) / 2**20,
                      speculate=args.speculate,
                      workers=state.get("workers"), max_queue=state.get("max_queue"),
                      batching=state.get("batching"),
                      batched=state.get("scheduler", {}).get("batched"))
        queries = short_queries()
        result["loadavg"] = {"start": os.getloadavg()[0]}
        if "scaling" in args.phases:
            result["phases"]["scaling"] = await scaling_rounds(client, model, queries, args)
        if "ttft" in args.phases:
            result["phases"]["ttft"] = await ttft(
                client, model, load_requests(args.probes), queries, args.scale_clients - 1,
                args.long_tokens, args.rounds)
        if "soak" in args.phases:
            result["phases"]["soak"] = await soak(client, model, server,
                                                  load_requests(args.requests), args.clients,
                                                  args.duration)
        result["loadavg"]["end"] = os.getloadavg()[0]
        result["peak_rss_mib"] = (proc_status(server.proc.pid, "VmHWM") or 0) / 2**20
        result["scheduler"] = (await health(client)).get("scheduler")
    finally:
        await client.close()
        server.stop()
    info = machine_info()
    result["machine"] = f"{info['cpu']}, {info['logical_cpus']} CPUs, Python {info['python']}"
    result["command"] = "needlepoint-bench-load " + " ".join(args.argv)
    return result


async def scaling_rounds(client: openai.AsyncOpenAI, model: str, queries: list[str],
                         args: argparse.Namespace) -> dict[str, Any]:
    """1 client, then `scale_clients`, alternating for `rounds` rounds (both see the same
    machine); the ratio is the median of the rounds' ratios."""
    window = args.scale_duration / args.rounds
    runs: dict[int, list[dict[str, Any]]] = {1: [], args.scale_clients: []}
    for _ in range(args.rounds):
        for n in runs:
            runs[n].append(await scaling(client, model, queries, n, window, args.max_tokens))
    ratios = [many["tokens_per_s"] / one["tokens_per_s"]
              for one, many in zip(runs[1], runs[args.scale_clients], strict=True)]
    total = []
    for n, parts in runs.items():
        batches = [p["mean_batch"] for p in parts if p["mean_batch"] is not None]
        errors: dict[str, int] = {}
        for part in parts:
            for kind, count in part["errors"].items():
                errors[kind] = errors.get(kind, 0) + count
        total.append({"clients": n, "requests": sum(p["requests"] for p in parts),
                      "tokens": sum(p["tokens"] for p in parts),
                      "seconds": sum(p["seconds"] for p in parts),
                      "tokens_per_s": sum(p["tokens"] for p in parts)
                      / sum(p["seconds"] for p in parts),
                      "mean_batch": sum(batches) / len(batches) if batches else None,
                      "errors": errors})
    return {"max_tokens": args.max_tokens, "rounds": args.rounds, "runs": total,
            "round_ratios": ratios, "ratio": sorted(ratios)[len(ratios) // 2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="needlepoint-bench-load", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default="toy", help="toy, shipped, or an archive path")
    parser.add_argument("--label", default=None, help="result name (default: from the model)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated, of {', '.join(PHASES)}")
    parser.add_argument("--clients", type=int, default=64, help="soak clients")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of soak")
    parser.add_argument("--scale-clients", type=int, default=16)
    parser.add_argument("--scale-duration", type=float, default=60.0,
                        help="seconds of each client count, over all rounds")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternations of the scaling and ttft measurements")
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="max_tokens of the scaling requests")
    parser.add_argument("--long-tokens", type=int, default=200,
                        help="max_tokens of the decoders running beside the ttft probes")
    parser.add_argument("--probes", type=int, default=10, help="ttft probes (eval requests)")
    parser.add_argument("--workers", type=int, default=None,
                        help="server --workers (default: the server's)")
    parser.add_argument("--no-batching", dest="batching", action="store_false")
    parser.add_argument("--no-speculate", dest="speculate", action="store_false",
                        help="serve with --no-speculate (one forward pass per token)")
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--requests", type=int, default=48, help="distinct eval requests used")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    parser.add_argument("--out", type=Path, default=OUT, help="report file ('-': none)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.phases = [p for p in args.phases.split(",") if p]
    if unknown := set(args.phases) - set(PHASES):
        parser.error(f"unknown phases: {sorted(unknown)}")
    name = args.model
    args.model = model_path(args.model)
    label = args.label or (Path(name).stem if name not in ("toy", "shipped") else name)
    if not args.batching and args.label is None:
        label += "-nobatch"
    if not args.speculate and args.label is None:
        label += "-nospec"
    result = asyncio.run(run(args))
    result["label"] = label
    print(json.dumps(result, indent=2))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"load_{label}.json").write_text(json.dumps(result, indent=2) + "\n")
    if str(args.out) != "-":
        write_report(sorted(RESULTS_DIR.glob("load_*.json")), args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
