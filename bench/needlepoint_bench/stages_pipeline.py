"""The pipelining figures of `bench/stages.py` (run inside its loopback namespace).

For a model (SmolLM2-135M int8 from its GGUF; the shipped Needle 3 geometry in deploy
numerics), measured against one single-threaded process in the same run:

* **hop cost**: decode tokens/s of one request on 2 Ray stages (one per node) vs one
  process;
* **pipelined aggregate**: 8 concurrent requests stepping together, each engine step one
  `run_batch` of their 8 next tokens (what the server's scheduler does), on 2 pipelined Ray
  stages (`pipeline.default_micro_batches`: 8 micro-batches of one request for SmolLM2, 4 of
  two for Needle 3), vs the same 8 requests on one process (its own `run_batch` where it has
  one, Needle 3's stacked pass; else one request after the other); and the same 8 requests
  in 2 engine loops (threads, 4 requests each, each with its own `run_batch` calls: what the
  server's scheduler does for a 2-stage model, one engine loop per stage), so one loop's
  micro-batches enter the stages while the other's are in them: the pipeline does not drain
  between steps (Needle 3: each loop's call, made while the other's is in flight, is one
  stacked micro-batch of 4). This last figure is the issue's target (>= 1.6x).

Each node has one logical CPU (`num_cpus=1`): one stage per node, one thread each. Every
figure is the best of `repeats` interleaved rounds (other work on a shared machine only ever
adds time); the load average is recorded before and after.
"""

from __future__ import annotations

import os
import time

import numpy as np

from .tables import markdown_table

REQUESTS = 8


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _prompts(vocab: int, count: int, length: int) -> list[np.ndarray]:
    return [((np.arange(1, length + 1) * (7919 + 31 * k)) % (vocab - 7) + 5).astype(np.int64)
            for k in range(count)]


def _batch(model, requests):
    run_batch = getattr(model, "run_batch", None)
    if run_batch is not None:
        return run_batch(requests)
    return [session.prefill(ids) if not every else session.extend(ids)
            for session, ids, every in requests]


def _steps(model, sessions, prompts, first: int, last: int) -> None:
    for t in range(first, last):
        if len(sessions) == 1:
            sessions[0].step(int(prompts[0][t]))
        else:
            _batch(model, [(s, [int(p[t])], False) for s, p in zip(sessions, prompts,
                                                                     strict=True)])


def decode_rate(model, count: int, prompt: int, steps: int, loops: int = 1) -> float:
    """Aggregate decode tokens/s of `count` requests stepping together after a prefill;
    `loops` engine loops (threads), each stepping its share of the requests with its own
    `run_batch` calls, so each loop's micro-batches enter the stages while the others'
    are in them (what a scheduler with one engine loop per stage would do)."""
    import threading

    prompts = _prompts(model.config.vocab, count, prompt + steps)
    sessions = [model.session() for _ in range(count)]
    _batch(model, [(s, p[:prompt], False) for s, p in zip(sessions, prompts, strict=True)])
    shares = [range(k, count, loops) for k in range(loops)]
    threads = [threading.Thread(target=_steps, args=(
        model, [sessions[i] for i in share], [prompts[i] for i in share], prompt,
        prompt + steps)) for share in shares]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = count * steps / (time.perf_counter() - start)
    for session in sessions:
        close = getattr(session, "close", None)
        if close:
            close()
    return rate


def measure_model(label: str, path, numerics: str, args) -> dict:
    import needlepoint
    from needlepoint.stages import load_staged

    one = needlepoint.load(path, numerics=numerics, threads=1, cache=False)
    staged = load_staged(path, 2, transport="ray", placement=["node_a", "node_b"],
                         numerics=numerics, threads=1, cache=False, stage_cpus=1)
    best: dict = {}
    load_before = _load()
    try:
        for round_index in range(args.repeats):
            for name, model, count, loops in (
                    ("one/1", one, 1, 1), ("ray2/1", staged, 1, 1), ("one/8", one, REQUESTS, 1),
                    ("ray2/8", staged, REQUESTS, 1), ("ray2/8x2", staged, REQUESTS, 2)):
                rate = decode_rate(model, count, args.pipeline_prompt, args.pipeline_steps,
                                   loops)
                print(f"{label} round {round_index} {name}: {rate:.1f} tok/s", flush=True)
                best[name] = max(best.get(name, 0.0), rate)
        info = staged.stage_info()
    finally:
        staged.close()
    return {"model": label, "numerics": numerics, "tok_s": {k: round(v, 2) for k, v in
                                                             best.items()},
            "hop_ratio": round(best["ray2/1"] / best["one/1"], 3),
            "pipelined_ratio": round(best["ray2/8"] / best["one/8"], 3),
            "two_loops_ratio": round(best["ray2/8x2"] / best["one/8"], 3),
            "stages": [(i["first"], i["end"]) for i in info],
            "load_before": load_before, "load_after": _load()}


def profile_parts(path, numerics: str, cut: int, steps: int = 40) -> dict:
    """ms per decode token of each piece of a 2-stage split, run in this process one after
    the other (the 20th percentile of `steps` steps after a 64-token prompt): the head's
    embedding, stage 0's blocks, stage 1's blocks, the head's read-out."""
    from needlepoint import load_part

    head = load_part(path, head=True, numerics=numerics, cache=False)
    blocks = head.config.num_layers
    stages = [load_part(path, blocks=b, numerics=numerics, cache=False)
              for b in ((0, cut), (cut, blocks))]
    state = head.head_state()
    caches = [stage.range_state() for stage in stages]
    prompt = _prompts(head.config.vocab, 1, 64 + steps)[0]
    times: dict = {"embed": [], "stage 0": [], "stage 1": [], "read-out": []}
    for t in range(0, 64 + steps):
        tokens = prompt[:64] if t == 0 else prompt[t : t + 1]
        if 0 < t < 64:
            continue
        start = 0 if t == 0 else t
        marks = [time.perf_counter()]
        embedded = head.embed(state, tokens, start)
        marks.append(time.perf_counter())
        x = embedded.x
        for stage, cache in zip(stages, caches, strict=True):
            x = stage.run_layers(stage.blocks.start, stage.blocks.stop, x, cache, start,
                                 embedded.side)
            marks.append(time.perf_counter())
        head.readout(stages[-1].final_rows(x, "last"))
        marks.append(time.perf_counter())
        if t:
            for name, a, b in zip(times, marks, marks[1:], strict=False):
                times[name].append(b - a)
    return {name: round(float(np.percentile(v, 20)) * 1e3, 2) for name, v in times.items()}


def pipelined(args, shipped) -> list[dict]:
    """Both models' figures (the cluster is already up, nodes node_a and node_b)."""
    import needlepoint

    smollm2 = needlepoint.resolve_model_name("smollm2")
    rows = [measure_model("SmolLM2-135M (Q4_1 GGUF)", smollm2, "int8", args),
            measure_model("Needle 3 shipped geometry", shipped, "deploy", args)]
    rows[0]["profile_ms"] = profile_parts(smollm2, "int8", 15)
    rows[1]["profile_ms"] = profile_parts(shipped, "deploy", 10)
    return rows


def render_pipeline(rows: list[dict], args_text: str) -> list[str]:
    lines = ["## Pipelining across requests (2 Ray stages, one core each)", "",
             args_text + " Measured by `needlepoint-bench-stages` (or `--only-pipeline`, which "
             "keeps the sections above from their last run); the Ray cluster is two nodes "
             "with one logical CPU each.", ""]
    lines += markdown_table(
        ["model", "one process, 1 request", "2 stages, 1 request", "hop cost",
         f"one process, {REQUESTS} requests", f"2 stages, {REQUESTS} requests, pipelined",
         "pipelined vs one process", "same, 2 engine loops (the scheduler's)", "vs one process",
         "load avg before / after"],
        [[row["model"], f"{row['tok_s']['one/1']:.1f} tok/s",
          f"{row['tok_s']['ray2/1']:.1f} tok/s", f"{row['hop_ratio']:.2f}x",
          f"{row['tok_s']['one/8']:.1f} tok/s", f"{row['tok_s']['ray2/8']:.1f} tok/s",
          f"**{row['pipelined_ratio']:.2f}x**", f"{row['tok_s']['ray2/8x2']:.1f} tok/s",
          f"**{row['two_loops_ratio']:.2f}x**",
          f"{row['load_before'][0]} / {row['load_after'][0]}"] for row in rows],
        align="lrrrrrrrrl")
    lines += ["", "Profile of one decode token of the same 2-stage split, every piece run in one "
              "process one after the other (ms, 20th percentile; `profile_parts`):", ""]
    profiles = []
    for row in rows:
        p = row.get("profile_ms")
        if not p:
            continue
        total = sum(p.values())
        ceiling = total / max(p["stage 0"], p["stage 1"], p["embed"] + p["read-out"])
        profiles.append([row["model"], f"{p['embed']:.2f}", f"{p['stage 0']:.2f}",
                         f"{p['stage 1']:.2f}", f"{p['read-out']:.2f}", f"{ceiling:.2f}x",
                         f"{min(ceiling, 2.0):.2f}x"])
    lines += markdown_table(["model", "head: embedding", "stage 0 blocks", "stage 1 blocks",
                             "head: read-out", "ceiling: a core each",
                             "ceiling on this machine's 2 cores"], profiles, align="lrrrrrr")
    return lines + [""]
