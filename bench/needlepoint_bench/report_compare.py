"""Before and after: an earlier run's results beside this run's, on `docs/benchmarks.md`.

The earlier run is `bench/results/<fixture>-before.json` (kept from the run before a change;
`needlepoint-bench --before PATH` names another). Each run's ratios are against needle-rs in
that same run, so the ratio columns compare like with like even when the machine's load
differed; the tok/s columns are each run's own medians and move with the machine.
"""

from __future__ import annotations

from .engines import NP_DEPLOY, NP_FLOAT
from .report_format import LABEL
from .report_tables import headline_rows
from .tables import markdown_table

PROFILE_ROWS = 6


def _run_line(results: dict) -> str:
    m = results.get("machine", {})
    load = results.get("loadavg_start", [])
    return (f"git {m.get('git')}, {results.get('started')}, native kernels "
            f"{m.get('native_variant', 'not recorded')}, load average at start "
            f"{load[0]:.2f}" if load else f"git {m.get('git')}, {results.get('started')}")


def _side_by_side(profiles: list[list[tuple[str, float]]]) -> list[str]:
    """The top PROFILE_ROWS (function, ms) of a before and an after profile as one table."""
    rows = []
    for index in range(PROFILE_ROWS):
        cells = []
        for top in profiles:
            cells += [f"`{top[index][0]}`", f"{top[index][1]:.2f}"] if index < len(top) \
                else ["", ""]
        rows.append(cells)
    return markdown_table(["before: function", "ms", "after: function", "ms"], rows)


def _figures(before: dict, after: dict, engine: str) -> list[list[str]]:
    old = {(row["figure"], row["threads"]): row for row in headline_rows(before, engine)}
    rows = []
    for row in headline_rows(after, engine):
        was = old.get((row["figure"], row["threads"]))
        if was is None:
            continue
        rows.append([row["figure"], row["threads"], was["needlepoint"], row["needlepoint"],
                     was["ratio"], row["ratio"], row["target"]])
    return rows


def _profile(results: dict, engine: str, threads: str) -> dict | None:
    raw = results.get("timing", {}).get("raw", {}).get(threads, {})
    prof = raw.get("engines", {}).get(engine, {}).get("decode_profile")
    return prof if prof and "calls_per_token" in prof else None


def _profiles(before: dict, after: dict, engine: str) -> list[str]:
    L = []
    for threads in sorted(after.get("timing", {}).get("raw", {})):
        pair = _profile(before, engine, threads), _profile(after, engine, threads)
        if None in pair:
            continue
        L.append(f"**{LABEL.get(engine, engine)}, {threads} thread(s), decode step profile** "
                 f"(cProfile, own ms per token; {pair[0]['calls_per_token']:.0f} → "
                 f"{pair[1]['calls_per_token']:.0f} interpreter calls per token):\n")
        L += _side_by_side([[(row["function"], row["own_ms_per_token"]) for row in prof["top"]]
                            for prof in pair])
        L.append("")
    return L


def before_after_section(after: dict, before: dict | None) -> list[str]:
    """The headline figures and the decode-step profiles of `before` and `after`."""
    if not before:
        return []
    L = ["\n## Before and after\n",
         f"*Before*: {_run_line(before)}. *After* (this page): {_run_line(after)}. Ratios "
         "are against needle-rs measured in the same run as each; tok/s are each run's "
         "medians.\n"]
    for engine in (NP_DEPLOY, NP_FLOAT):
        rows = _figures(before, after, engine)
        if not rows:
            continue
        L.append(f"**{LABEL.get(engine, engine)}**\n")
        L += markdown_table(["figure", "threads", "before", "after", "ratio before",
                             "ratio after", "target"], rows)
        L.append("")
        L += _profiles(before, after, engine)
    return L


def _hf_ratios(record: dict, engine: str, threads: str) -> dict | None:
    engines = record.get("speed", {}).get(threads, {})
    base, best = engines.get("llama.cpp", {}).get("best"), engines.get(engine, {}).get("best")
    if not base or not best:
        return None
    return {"prefill": best["prefill_tok_s"], "decode": best["decode_tok_s"],
            "prefill_x": best["prefill_tok_s"] / base["prefill_tok_s"],
            "decode_x": best["decode_tok_s"] / base["decode_tok_s"]}


def _hf_profile_ms(record: dict) -> tuple[float, list[tuple[str, float]]] | None:
    prof = (record.get("profile") or {}).get("fused")
    if not prof:
        return None
    steps = prof["steps"]
    return (prof["step_s_unprofiled"] * 1e3,
            [(row["function"], row["own_s"] / steps * 1e3) for row in prof["functions"]])


def hf_before_after(after: dict, before: dict | None) -> list[str]:
    """`docs/benchmarks_hf.md`'s before/after: each engine's best tok/s and its ratio to
    llama.cpp in the same run, and the int8 decode step's profile, before and after."""
    if not before:
        return []
    lines = ["", "## Before and after", "",
             f"*Before*: {before.get('started')} (git {before.get('machine', {}).get('git')}). "
             f"*After*: {after.get('started')} (git {after.get('machine', {}).get('git')}). "
             "Each ratio is to llama.cpp in the same run.", ""]
    rows = []
    for threads in after.get("speed", {}):
        for engine in after["speed"][threads]:
            if engine == "llama.cpp":
                continue
            was, now = _hf_ratios(before, engine, threads), _hf_ratios(after, engine, threads)
            if was is None or now is None:
                continue
            rows.append([engine, threads,
                         f"{was['prefill']:.0f} ({was['prefill_x']:.2f}x)",
                         f"{now['prefill']:.0f} ({now['prefill_x']:.2f}x)",
                         f"{was['decode']:.0f} ({was['decode_x']:.2f}x)",
                         f"{now['decode']:.0f} ({now['decode_x']:.2f}x)"])
    lines += markdown_table(["engine", "threads", "prefill tok/s before", "after",
                             "decode tok/s before", "after"], rows)
    pair = _hf_profile_ms(before), _hf_profile_ms(after)
    if None not in pair:
        lines += ["", f"int8 decode step, 1 thread, without a profiler: {pair[0][0]:.2f} ms "
                  f"before, {pair[1][0]:.2f} ms after; own time under cProfile, ms per step:",
                  ""]
        lines += _side_by_side([functions for _, functions in pair])
    return lines + [""]
