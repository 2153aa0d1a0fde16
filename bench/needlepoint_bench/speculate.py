"""Speculative decoding benchmark (issue 13): `needlepoint-bench-speculate`.

1. **Toy eval set** (`shared/models/needle3-toy.eval.jsonl`, the bundled demo model): every
   example is decoded with and without speculation in the same run through the public
   `Needle` API (`speculate=True/False`), greedy, as `needlepoint eval` decodes (at most 80
   new tokens, no reasoning budget), the grammar on (and off). Which mode goes first
   alternates per example, so load drift on a shared machine hits both alike. Reported:
   forward passes per generated token, decode and prefill+decode wall time, the drafts and
   acceptance per source (the envelope's timings), and whether every example produced the
   same answer (it must).
2. **Verify cost** (`shared/fixtures/needle3/shipped.cact`, the released geometry, and the
   toy model): the time of `session.extend(k ids)` against one `session.step` for
   k = 2, 4, 8, 16, after a 200-token prompt, median of `--reps` (each extend rewound
   outside the timing).

Writes `bench/results/speculate.json` and the "Speculative decoding" section of
`docs/benchmarks.md` (that section only; the rest of the file is left as it is).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from .paths import DOCS_MD, RESULTS_DIR, shared_dir
from .tables import markdown_table, replace_section

SECTION = "## Speculative decoding (prompt lookup + grammar fast-forward)"
KS = (2, 4, 8, 16)
SOURCES = ("lookup", "grammar", "opening")


def _examples(limit: int) -> list[dict[str, Any]]:
    path = shared_dir() / "models" / "needle3-toy.eval.jsonl"
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return rows[:limit]


def _answer(model: Any, example: dict, grammar_on: bool, speculate: bool) -> dict:
    """One greedy turn through the public `Needle` API, as `needlepoint eval` decodes (at
    most 80 new tokens, no reasoning budget, no system turn): its envelope."""
    import needlepoint

    needle = needlepoint.Needle(tools=example["tools"], model=model, cache=None,
                                grammar=grammar_on, speculate=speculate, max_new_tokens=80,
                                reasoning_budget=None)
    return needle.complete(example["query"])


def _answer_of(envelope: dict) -> tuple:
    """What must not change with speculation: the decoded answer and its length."""
    return (envelope["type"], json.dumps(envelope["function_calls"], sort_keys=True),
            envelope["text"], envelope["reasoning"], envelope["timings"]["decode_tokens"])


def eval_set(model: Any, examples: list[dict], grammar_on: bool, warmup: int,
             repeat: int = 1) -> dict:
    """Both modes over the examples (after `warmup` untimed ones); totals per mode. Each
    example is decoded `repeat` times per mode (the modes alternating) and its fastest
    prefill and decode kept, which filters out bursts of load from other processes."""
    totals = {mode: {"tokens": 0, "passes": 0, "decode_s": 0.0, "prefill_s": 0.0,
                     **{f"{s}_{w}": 0 for s in SOURCES for w in ("drafted", "accepted")}}
              for mode in ("speculate", "plain")}
    mismatches = 0
    for index, example in enumerate(examples[:warmup] + examples):
        timed = index >= warmup
        order = ("speculate", "plain") if index % 2 else ("plain", "speculate")
        answers: dict[str, tuple] = {}
        best: dict[str, list[float]] = {}
        for _ in range(repeat if timed else 1):
            for mode in order:
                envelope = _answer(model, example, grammar_on, mode == "speculate")
                timings = envelope["timings"]
                if mode in answers:
                    mismatches += _answer_of(envelope) != answers[mode]
                    best[mode] = [min(best[mode][0], timings["decode_s"]),
                                  min(best[mode][1], timings["prefill_s"])]
                    continue
                answers[mode] = _answer_of(envelope)
                best[mode] = [timings["decode_s"], timings["prefill_s"]]
                if not timed:
                    continue
                total = totals[mode]
                total["tokens"] += timings["decode_tokens"]
                total["passes"] += timings.get("decode_passes", timings["decode_tokens"])
                for key in total:
                    if key.endswith(("_drafted", "_accepted")):
                        total[key] += timings.get(key, 0)
            order = order[::-1]
        if timed:
            for mode, (decode_s, prefill_s) in best.items():
                totals[mode]["decode_s"] += decode_s
                totals[mode]["prefill_s"] += prefill_s
        mismatches += timed and answers["speculate"] != answers["plain"]
    spec, plain = totals["speculate"], totals["plain"]
    return {
        "examples": len(examples), "grammar": grammar_on, "mismatches": mismatches,
        "repeat": repeat,
        "speculate": spec, "plain": plain,
        "passes_per_token": spec["passes"] / max(1, spec["tokens"]),
        "plain_passes_per_token": plain["passes"] / max(1, plain["tokens"]),
        "decode_speedup": plain["decode_s"] / max(1e-9, spec["decode_s"]),
        "turn_speedup": (plain["decode_s"] + plain["prefill_s"])
        / max(1e-9, spec["decode_s"] + spec["prefill_s"]),
    }


def verify_cost(model: Any, reps: int, prompt: int = 200) -> dict:
    """Seconds of one step and of extend(k) for each k, on one prefilled session: the
    fastest of `reps` (the sizes interleaved), which filters out other processes' load."""
    vocab = model.config.vocab
    session = model.session()
    session.prefill([(7 * i + 11) % vocab for i in range(prompt)], logits=False)
    times: dict[int, list[float]] = {k: [] for k in (1, *KS)}
    for rep in range(reps + 1):
        for k in (1, *KS) if rep % 2 else (*KS[::-1], 1):
            ids = [(13 * (i + rep) + 5) % vocab for i in range(k)]
            start = time.perf_counter()
            if k == 1:
                session.step(ids[0])
            else:
                session.extend(ids)
            elapsed = time.perf_counter() - start
            session.rewind(k)
            if rep:  # the first round warms caches
                times[k].append(elapsed)
    step = min(times[1])
    rows = {k: min(times[k]) for k in KS}
    return {"prompt": prompt, "reps": reps, "step_s": step,
            "step_median_s": statistics.median(times[1]),
            "extend_s": {str(k): v for k, v in rows.items()},
            "extend_median_s": {str(k): statistics.median(times[k]) for k in KS},
            "ratio": {str(k): v / step for k, v in rows.items()}}


def _table_eval(runs: list[dict]) -> list[str]:
    rows = []
    for run in runs:
        spec, plain = run["speculate"], run["plain"]
        rows.append([
            "on" if run["grammar"] else "off", run["examples"], spec["tokens"],
            f"{run['plain_passes_per_token']:.3f}", f"**{run['passes_per_token']:.3f}**",
            f"{plain['decode_s']:.2f} / {spec['decode_s']:.2f}",
            f"**{run['decode_speedup']:.2f}x**",
            f"{plain['prefill_s']:.2f} / {spec['prefill_s']:.2f}",
            f"{run['turn_speedup']:.2f}x",
            f"{run['examples'] - run['mismatches']}/{run['examples']}"])
    lines = markdown_table(
        ["grammar", "examples", "tokens", "passes/token (plain)", "passes/token (speculate)",
         "decode s (plain / speculate)", "decode speedup", "prefill s (plain / speculate)",
         "prefill+decode speedup", "same answer"], rows)
    sources = []
    for run in runs:
        spec = run["speculate"]
        for source in SOURCES:
            drafted, accepted = spec[f"{source}_drafted"], spec[f"{source}_accepted"]
            rate = f"{accepted / drafted:.0%}" if drafted else "-"
            sources.append(["on" if run["grammar"] else "off", source, drafted, accepted, rate])
    return lines + [""] + markdown_table(
        ["grammar", "source", "drafted", "accepted", "acceptance"], sources)


def _table_cost(costs: dict[str, dict]) -> list[str]:
    rows = []
    for name, cost in costs.items():
        step = cost["step_s"]
        cells = [f"{cost['extend_s'][str(k)] * 1e3:.1f} ({cost['ratio'][str(k)]:.2f}x)"
                 for k in KS]
        slope = (cost["extend_s"][str(KS[-1])] - cost["extend_s"][str(KS[1])]) / (
            KS[-1] - KS[1]) / step
        rows.append([name, f"{step * 1e3:.1f}", *cells, f"{slope:.2f}"])
    return markdown_table(["model", "step ms", *(f"extend({k}) ms (x step)" for k in KS),
                           "per extra position (x step)"], rows)


def render(result: dict) -> str:
    loads = ", ".join(f"{part} {low:.1f}-{high:.1f}" for part, (low, high) in (
        ("eval", result["eval_load"]), ("verify cost", result["cost_load"])))
    lines = [SECTION, "",
             f"`needlepoint-bench-speculate` ({result['date']}; {result['cpus']} logical CPUs, "
             f"1 thread; load average while measuring: {loads}; a shared machine, so read "
             "ratios from the same run, not absolute times). Speculation "
             "(`generation/speculate.py`, `drafts.py`, `draft_policy.py`) verifies drafts "
             "from prompt lookup, the grammar's fast-forward tokens and the call opening "
             "in one `session.extend` pass and rewinds what the model does not pick; the "
             "tokens are the same as without it (the last column, and "
             "`tests/generation/test_speculate_property.py`).", "",
             f"### Toy eval set, with and without speculation "
             f"({result['warmup']} warm-up examples first; each example decoded "
             f"{result['eval'][0]['repeat']} times per mode, modes alternating, the fastest "
             "prefill and decode kept)", ""]
    lines += _table_eval(result["eval"])
    lines += ["", "Passes count forward passes after the prefill (plain decoding: one per "
              "token but the first). The call opening (`▁<tool_call>[{\"name\":\"`) is "
              "verified with the prompt: in its last chunk when that chunk is short, else in "
              "one pass of its own (here: ~180-token prompts, so one extra pass, which is "
              "what the prefill column's difference shows). The prefill is otherwise the "
              "same work in both modes, hence the smaller turn-level speedup.", "",
              f"### Cost of verifying k positions in one pass (after a "
              f"{next(iter(result['verify_cost'].values()))['prompt']}-token prompt; fastest "
              f"of {next(iter(result['verify_cost'].values()))['reps']})", ""]
    lines += _table_cost(result["verify_cost"])
    lines += ["", "A draft token is worth a position when its chance of being used exceeds "
              "the per-position cost in steps (`draft_policy.py` times this per model): "
              "grammar-forced tokens always are; prompt-lookup guesses are cut early at "
              "the shipped geometry, where a position costs a large fraction of a step.", ""]
    return "\n".join(lines)


def write_section(text: str) -> None:
    """Replace (or append) the section in docs/benchmarks.md, leaving the rest as it is."""
    replace_section(DOCS_MD, SECTION, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-speculate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=300, help="eval examples (default all)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed examples first")
    parser.add_argument("--grammar", choices=("on", "off", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=2,
                        help="decodes per example and mode; the fastest is kept (default 2)")
    parser.add_argument("--reps", type=int, default=25, help="verify-cost repetitions")
    parser.add_argument("--parts", default="eval,cost",
                        help="what to measure: eval, cost or both (a part left out is taken "
                        "from bench/results/speculate.json)")
    parser.add_argument("--cost-models", default="shipped,toy",
                        help="models of the verify-cost part: shipped, toy or both")
    parser.add_argument("--no-write", action="store_true", help="print, do not write files")
    args = parser.parse_args(argv)
    os.environ.setdefault("NEEDLEPOINT_CACHE", "0")
    import needlepoint

    parts = set(args.parts.split(","))
    previous_path = RESULTS_DIR / "speculate.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    toy = needlepoint.load(shared_dir() / "models" / "needle3-toy.cact")
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
              "warmup": args.warmup}
    if "eval" in parts or "eval" not in previous:
        load_before = os.getloadavg()[0]
        examples = _examples(args.limit)
        modes = {"on": (True,), "off": (False,), "both": (True, False)}[args.grammar]
        result["eval"] = [eval_set(toy, examples, grammar, args.warmup, args.repeat)
                          for grammar in modes]
        result["eval_load"] = (load_before, os.getloadavg()[0])
    else:
        for key in ("eval", "warmup", "eval_load"):
            result[key] = previous[key]
    if "cost" in parts or "verify_cost" not in previous:
        load_before = os.getloadavg()[0]
        chosen = set(args.cost_models.split(","))
        result["verify_cost"] = {}
        if "shipped" in chosen:
            shipped = needlepoint.load(shared_dir() / "fixtures" / "needle3" / "shipped.cact")
            result["verify_cost"]["shipped (d 768, 20 layers, vocab 8192)"] = verify_cost(
                shipped, args.reps)
        if "toy" in chosen:
            result["verify_cost"]["toy (d 128, 4 layers, vocab 1024)"] = verify_cost(
                toy, args.reps)
        result["cost_load"] = (load_before, os.getloadavg()[0])
    else:
        for key in ("verify_cost", "cost_load"):
            result[key] = previous[key]
    runs = result["eval"]
    text = render(result)
    print(text)
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "speculate.json").write_text(json.dumps(result, indent=2) + "\n")
        write_section(text)
    return 0 if all(run["mismatches"] == 0 for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
