"""Fit `answer_grammar.AUTO_CALL_THRESHOLD` on BFCL's `live_*` categories (auto mode only).

    python -m needlepoint_bench.bfcl_threshold --model qwen2.5-coder-0.5b --limit 20 \
        --out bench/results/bfcl_threshold_fit.json
    python -m needlepoint_bench.bfcl_threshold --refit bench/results/bfcl_threshold_fit.json

Each case goes through `Needle.complete` (the case's system text and user message: the same
prompt ids `needlepoint serve` decodes for its one-user-message chat; `tool_choice` auto,
greedy, `bfcl_serve`'s token limits); the envelope's `route` decision gives the probability
the model gave the call side at the answer's first token (`route.py`).

A threshold `t` declines every call whose route chose to call with a call-side probability
below `t`; the answer is then text, which is right on `live_irrelevance` and wrong elsewhere
(a call was wanted). That is the score the fit reads for each `t` (an estimate: a declined
answer's text could still be a JSON call that `call_salvage` reads back; text answers and
calls recovered from text are unchanged, their route chose text). Candidates: 0 (off) and
each midpoint between consecutive call probabilities. The best `t` is shipped only if it
scores above 0 (off).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from . import bfcl_data
from .bfcl_serve import max_tokens_for, wants_call

LIVE = ("live_simple", "live_multiple", "live_irrelevance", "live_relevance")


def answer(model: Any, case: dict[str, Any], category: str) -> dict[str, Any]:
    """One auto answer (`Needle.complete`, the case's system text and user message), with
    its route probability."""
    import needlepoint

    tools = bfcl_data.to_tools(bfcl_data.prompt_functions(case, category), category)
    messages = bfcl_data.messages_of(case)
    system = next((m["content"] for m in messages if m["role"] == "system"), None)
    start = time.perf_counter()
    try:
        needle = needlepoint.Needle(tools=tools, model=model, system=system,
                                    max_new_tokens=max_tokens_for(category))
        envelope = needle.complete(messages[-1]["content"])
    except needlepoint.NeedlepointError as error:  # a refused request is recorded, not fatal
        return {"id": case["id"], "category": category, "error": f"{type(error).__name__}: "
                f"{error}"[:200], "called": False, "p_call": None, "right": False}
    calls = [{"name": c["name"], "arguments": c["arguments"]}
             for c in envelope.get("function_calls", [])]
    route = next((d for d in envelope.get("decisions", []) if d["kind"] == "route"), None)
    # the route's probability is that of the side it chose (`route.route`)
    by_route = bool(calls) and envelope.get("call_syntax") != "text"
    p_call = None if route is None else (route["prob"] if by_route else 1.0 - route["prob"])
    right, error_type = bfcl_data.score_detail(case, category, calls)
    return {"id": case["id"], "category": category, "called": by_route,
            "text_call": bool(calls) and not by_route, "p_call": p_call, "right": right,
            "error_type": error_type, "confidence": envelope.get("confidence"),
            "calls": calls, "seconds": round(time.perf_counter() - start, 3)}


def scored(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Right answers overall and per category when calls below `threshold` are declined."""
    per: dict[str, list[int]] = {}
    for row in rows:
        right = row["right"]
        if row["called"] and row["p_call"] is not None and row["p_call"] < threshold:
            right = not wants_call(row["category"])  # declined: a text answer
        got = per.setdefault(row["category"], [0, 0])
        got[0] += int(right)
        got[1] += 1
    total = sum(r for r, _ in per.values())
    n = sum(k for _, k in per.values())
    return {"threshold": threshold, "right": total, "n": n, "accuracy": total / n if n else 0.0,
            "per_category": {c: {"right": r, "n": k} for c, (r, k) in sorted(per.items())}}


def fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every candidate threshold's score and the one to ship (module doc)."""
    probs = sorted({r["p_call"] for r in rows if r["called"] and r["p_call"] is not None})
    candidates = [0.0] + [(a + b) / 2 for a, b in zip([0.0, *probs], probs, strict=False)]
    candidates += [probs[-1] + 1e-9] if probs else []
    scores = [scored(rows, t) for t in sorted(set(candidates))]
    best = max(scores, key=lambda s: (s["right"], -s["threshold"]))
    off = scores[0]
    calls = [r for r in rows if r["called"] and r["p_call"] is not None]
    ranges = {}
    for label, ok in (("right_calls", True), ("wrong_calls", False)):
        ps = [r["p_call"] for r in calls if r["right"] == ok]
        ranges[label] = {"n": len(ps), "min": min(ps, default=None),
                         "max": max(ps, default=None)}
    shipped = best["threshold"] if best["right"] > off["right"] else None
    return {"scores": scores, "best": best, "off": off, "call_probability": ranges,
            "shipped": shipped}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b",
                        help="a GGUF file, or a name real_models.py fetches")
    parser.add_argument("--category", default=",".join(LIVE))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--refit", type=Path, help="refit from a saved result's rows")
    args = parser.parse_args(argv)
    if args.refit is not None:
        report = json.loads(args.refit.read_text(encoding="utf-8"))
        print(json.dumps({k: v for k, v in fit(report["rows"]).items() if k != "scores"},
                         indent=1))
        return
    categories = [c for c in args.category.split(",") if c]
    if any(not c.startswith("live_") for c in categories):
        parser.error("the threshold is fitted on live_* categories only")
    import needlepoint

    from . import real_models

    model = Path(args.model)
    if not model.is_file():
        model = real_models.fetch(real_models.REAL_FILES.get(args.model, real_models.QWEN))
    loaded = needlepoint.load(model)
    report: dict[str, Any] = {"model": str(model), "limit": args.limit, "mode": "auto",
                              "categories": categories, "load_before": os.getloadavg(),
                              "rows": []}
    cases = {c: bfcl_data.load_cases(c, args.limit) for c in categories}
    for k in range(max(len(v) for v in cases.values())):
        for category in categories:
            if k < len(cases[category]):
                row = answer(loaded, cases[category][k], category)
                report["rows"].append(row)
                print(f"{category} {k + 1} called={row['called']} p_call={row['p_call']} "
                      f"right={row['right']}", flush=True)
        report["fit"] = fit(report["rows"])
        report["load_after"] = os.getloadavg()
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in report["fit"].items() if k != "scores"}, indent=1))


if __name__ == "__main__":
    main()
