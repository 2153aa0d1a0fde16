"""Turn a results JSON into `docs/benchmarks.md`, `docs/benchmarks_prefill.png` and a
console summary. Everything in the markdown is generated: edit this file, not the doc."""

from __future__ import annotations

import re
from pathlib import Path

from .engines import NEEDLE_RS, NP_DEPLOY, NP_FLOAT, cached
from .prompts import TOOL_PROMPT_NAME

LABEL = {NEEDLE_RS: "needle-rs", NP_DEPLOY: "needlepoint (deploy)", NP_FLOAT: "needlepoint (float)"}
LABEL.update(
    {cached(e): f"{LABEL[e][:-1]}, weight cache present)" for e in (NP_DEPLOY, NP_FLOAT)}
)
QUICK_NOTE = " (quick smoke run: few reps, short prompts)"
COLOR = {NEEDLE_RS: "tab:orange", NP_DEPLOY: "tab:blue", NP_FLOAT: "tab:green"}


# ----------------------------------------------------------------------------- helpers
def _num(x, digits: int = 1) -> str:
    if x is None:
        return "—"
    if isinstance(x, dict):
        x = x.get("median")
        if x is None:
            return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _range(d: dict | None, digits: int = 1) -> str:
    if not d or d.get("n", 0) == 0:
        return "—"
    return f"{_num(d['median'], digits)} [{_num(d['min'], digits)}–{_num(d['max'], digits)}]"


def _ratio(x) -> str:
    return "—" if x is None else f"{x:.2f}×"


def _mib(b) -> str:
    return "—" if b is None else f"{b / 2**20:.1f} MiB"


def _mb(b) -> str:
    return "—" if b is None else f"{b / 1e6:.2f} MB"


def _tsum(results: dict, threads: int) -> dict:
    return results.get("timing", {}).get("summary", {}).get(str(threads), {})


def _prompt_len(results: dict, name: str) -> int | None:
    for p in results.get("prompts", []):
        if p["name"] == name:
            return p["length"]
    return None


def _with_cached(engines: list[str]) -> list[str]:
    """Engines, each needlepoint one followed by its weight-cache-present variant."""
    return [x for e in engines for x in ((e,) if e == NEEDLE_RS else (e, cached(e)))]


def _unavailable(results: dict) -> dict:
    """engine -> first error seen anywhere, for engines that never ran."""
    out = {}
    for e in results.get("engines", []):
        ran = any(
            _tsum(results, t).get(e, {}).get("workloads") for t in results["config"]["threads"]
        )
        if ran:
            continue
        err = None
        for t in results["config"]["threads"]:
            err = err or _tsum(results, t).get(e, {}).get("error")
        for r in results.get("load", {}).get("raw", {}).get(e, []):
            err = err or r.get("error") or r.get("job_error")
        out[e] = err or "did not run"
    return out


def _met(direction: str, target: float, ratio) -> str:
    if ratio is None:
        return "n/a"
    ok = ratio >= target if direction == "speed" else ratio <= target
    return "yes" if ok else "**no**"


def _target_text(direction: str, target: float) -> str:
    return f"≥ {target:g}×" if direction == "speed" else f"≤ {target:g}×"


# ----------------------------------------------------------------------------- checks
def consistency_checks(results: dict) -> dict:
    """Did both engines see the same ids? Prompt lengths, first tokens, greedy agreement."""
    lengths = {p["name"]: p["length"] for p in results.get("prompts", [])}
    out: dict = {"prompt_tokens": [], "first_token": [], "decode": []}
    for t, raw in results.get("timing", {}).get("raw", {}).items():
        engs = raw.get("engines", {})
        rs = engs.get(NEEDLE_RS, {}).get("checks", {})
        for key, c in rs.items():
            name = key.split(":", 1)[1]
            out["prompt_tokens"].append(
                {
                    "threads": int(t),
                    "workload": key,
                    "ids_sent_to_needlepoint": lengths.get(name),
                    "needle_rs_reported": c.get("prompt_tokens"),
                    "match": c.get("prompt_tokens") == [lengths.get(name)],
                }
            )
        for np_name in (NP_FLOAT, NP_DEPLOY):
            mine = engs.get(np_name, {}).get("checks", {})
            for key, c in mine.items():
                r = rs.get(key)
                if not r:
                    continue
                if key.startswith("prefill:"):
                    out["first_token"].append(
                        {
                            "threads": int(t),
                            "workload": key,
                            "engine": np_name,
                            "needle_rs": r.get("first_token"),
                            "needlepoint": c.get("first_token"),
                            "agree": r.get("first_token") == c.get("first_token"),
                        }
                    )
                else:
                    a, b = c.get("tokens") or [], r.get("tokens") or []
                    k = 0
                    while k < min(len(a), len(b)) and a[k] == b[k]:
                        k += 1
                    out["decode"].append(
                        {
                            "threads": int(t),
                            "workload": key,
                            "engine": np_name,
                            "greedy_tokens_agreeing_from_start": k,
                            "of": min(len(a), len(b)),
                            "needle_rs_stop_reason": r.get("stop_reason"),
                        }
                    )
        for key, c in rs.items():
            if key.startswith("decode:"):
                out.setdefault("needle_rs_decode", []).append(
                    {
                        "threads": int(t),
                        "stop_reason": c.get("stop_reason"),
                        "tokens_generated": len(c.get("tokens") or []),
                    }
                )
    out["all_prompt_lengths_match"] = all(x["match"] for x in out["prompt_tokens"])
    return out


# ----------------------------------------------------------------------------- figures
def _marginal(results: dict, engine: str, threads: int = 1) -> list[tuple[str, float]]:
    """Cost of each added prompt token between consecutive fixed-length prompts (median
    times): flat means a per-token loop with no per-call overhead; rising means attention
    over the growing prefix starts to count."""
    ws = _tsum(results, threads).get(engine, {}).get("workloads", {})
    pts = sorted(
        (int(k[len("prefill:len") :]), w["seconds"]["median"])
        for k, w in ws.items()
        if k.startswith("prefill:len")
    )
    return [
        (f"{a}→{b}", (tb - ta) / (b - a) * 1e3)
        for (a, ta), (b, tb) in zip(pts, pts[1:], strict=False)
    ]


def headline_rows(results: dict, np_name: str) -> list[dict]:
    """Rows of the headline table for one needlepoint numerics mode."""
    rows = []
    rat = results.get("ratios", {}).get(np_name, {})
    targets = results.get("targets", {})
    tool_len = _prompt_len(results, TOOL_PROMPT_NAME)
    n_new = results["config"]["new_tokens"]
    figs = [
        ("load", "Load → first-token-ready, cold: no weight cache (s)", "time"),
        ("load_warm", "Load → first-token-ready, warm: weight cache present (s)", "time"),
    ]
    for n in results["config"].get("headline_lengths", []):
        figs.append((f"prefill:len{n}", f"Prefill, {n}-token prompt (tok/s)", "speed"))
    figs.append(
        (f"prefill:{TOOL_PROMPT_NAME}", f"Prefill, {tool_len}-token tool prompt (tok/s)", "speed")
    )
    figs.append(("decode", f"Decode, {n_new} new tokens after the tool prompt (tok/s)", "speed"))
    figs.append(("peak_rss", "Peak RSS, cold load (MiB)", "size"))
    figs.append(("peak_rss_warm", "Peak RSS, weight cache present (MiB)", "size"))
    figs.append(("bytes_per_token", "Weight bytes read per decode token (MB)", "size"))
    for key, label, kind in figs:
        for tkey, cell in sorted(rat.get(key, {}).items()):
            tgt = targets.get(key)
            if kind == "speed":
                a, b = _range(cell["needlepoint"]), _range(cell["needle_rs"])
            elif key.startswith("load"):
                a, b = _range(cell["needlepoint"], 3), _range(cell["needle_rs"], 3)
            elif key.startswith("peak_rss"):
                a = _num(cell["needlepoint"] / 2**20) if cell["needlepoint"] else "—"
                b = _num(cell["needle_rs"] / 2**20) if cell["needle_rs"] else "—"
            else:
                a = _num(cell["needlepoint"] / 1e6, 2) if cell["needlepoint"] else "—"
                b = _num(cell["needle_rs"] / 1e6, 2) if cell["needle_rs"] else "—"
            paired = cell.get("paired")
            rows.append(
                {
                    "figure": label,
                    "threads": tkey[1:],
                    "needle_rs": b,
                    "needlepoint": a,
                    "ratio": _ratio(cell.get("ratio")),
                    "ratio_cpu": _ratio(cell.get("ratio_cpu")) if kind == "speed" else "",
                    "paired": f"{paired['min']:.2f}–{paired['max']:.2f}" if paired else "",
                    "target": _target_text(tgt["direction"], tgt["target"]) if tgt else "—",
                    "met": _met(tgt["direction"], tgt["target"], cell.get("ratio")) if tgt else "",
                }
            )
    return rows


def plot(results: dict, path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib unavailable ({exc}); no plot"
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    tool_len = _prompt_len(results, TOOL_PROMPT_NAME)
    drew = False
    for t in results["config"]["threads"]:
        for e, summ in _tsum(results, t).items():
            ws = summ.get("workloads", {})
            pts = sorted(
                (int(k[len("prefill:len") :]), w["tok_s"])
                for k, w in ws.items()
                if k.startswith("prefill:len")
            )
            style = "-" if t == 1 else "--"
            label = f"{LABEL[e]}, {t} thread{'s' if t > 1 else ''}"
            if pts:
                x = [p[0] for p in pts]
                y = [p[1]["median"] for p in pts]
                lo = [p[1]["median"] - p[1]["p25"] for p in pts]
                hi = [p[1]["p75"] - p[1]["median"] for p in pts]
                ax.errorbar(
                    x,
                    y,
                    yerr=[lo, hi],
                    fmt=style + "o",
                    color=COLOR[e],
                    capsize=3,
                    mfc="white" if t > 1 else COLOR[e],
                    label=f"prefill: {label}",
                )
                drew = True
            tw = ws.get(f"prefill:{TOOL_PROMPT_NAME}")
            if tw and tool_len:
                ax.plot(
                    [tool_len],
                    [tw["tok_s"]["median"]],
                    "*",
                    ms=13,
                    color=COLOR[e],
                    mfc="white" if t > 1 else COLOR[e],
                )
            dw = next((w for k, w in ws.items() if k.startswith("decode:")), None)
            if dw:
                ax.axhline(
                    dw["tok_s"]["median"],
                    color=COLOR[e],
                    ls=":" if t == 1 else "-.",
                    lw=1.3,
                    label=f"decode: {label}",
                )
                drew = True
    if not drew:
        plt.close(fig)
        return "no timing data; no plot"
    from matplotlib.ticker import FixedLocator, LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    xt = sorted({int(p["length"]) for p in results["prompts"]})
    ax.xaxis.set_major_locator(FixedLocator(xt))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("prompt length (tokens); ★ = the tool prompt")
    ax.set_ylabel("tokens / s (median; bars: 25th–75th percentile)")
    m = results.get("machine", {})
    ax.set_title(
        f"Prefill and decode throughput — {Path(results['archive']).name}, "
        f"{m.get('cpu')} ({m.get('logical_cpus')} cpus)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


# ----------------------------------------------------------------------------- markdown
def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def headline_text(results: dict) -> str:
    lines = []
    unav = _unavailable(results)
    for e, err in unav.items():
        lines.append(f"{LABEL.get(e, e)}: UNAVAILABLE — {err}")
    for np_name in (NP_DEPLOY, NP_FLOAT):
        if np_name not in results.get("engines", []):
            continue
        rows = headline_rows(results, np_name)
        lines.append(f"\n{LABEL[np_name]} vs needle-rs")
        for r in rows:
            lines.append(
                f"  {r['figure'][:58]:58s} t{r['threads']}  rs {r['needle_rs']:>26s}  "
                f"np {r['needlepoint']:>26s}  {r['ratio']:>7s}  target {r['target']:>5s}"
                f" {r['met']}"
            )
    for e, d in results.get("decode_vs_floor", {}).items():
        for t, f in d.items():
            lines.append(
                f"{LABEL.get(e, e)} decode {t}: {f['decode_ms_per_token']:.2f} ms/token ="
                f" {f['multiple_of_dram_floor']:.1f}× the DRAM floor "
                f"({f['floor_ms_dram']:.2f} ms)"
            )
    return "\n".join(lines)


METHOD = """\
## Method

**What is compared.** One archive, the same token ids, the same number of new tokens, greedy
decoding, in one run of `python -m bench`. needle-rs builds its prompt itself from
`(query, tools_json, system)` (upstream wire format, `[BOS] + encode(prompt)`); the bench
renders the same string, tokenizes it with the archive's tokenizer and hands those ids to
needlepoint. Every needle-rs call reports its prompt length (`positions - len(token_ids)`),
which is checked against the ids needlepoint got (section *Checks*); where needlepoint's
float numerics run, their first greedy token is compared with needle-rs's as well (needle-rs
reproduces the fixture's float greedy tokens exactly).

**Workloads.** Prefill = prompt → logits of the last position → argmax: for needle-rs one
`generate(..., max_new_tokens=1)` call (render + tokenize + prefill + argmax, its only entry
point); for needlepoint `model.session()` + `session.prefill(ids)` + argmax (tokenization is
done beforehand and excluded; its cost for the longest prompt is listed below). Decode = n
greedy steps after the tool prompt: needlepoint times n × (`step(argmax)`) after a prefill;
needle-rs has no step API, so decode time is `generate(max_new_tokens=n+1)` minus
`generate(max_new_tokens=1)` measured back to back on the same prompt (its per-call fixed
cost and the prefill cancel). Fixed-length prompts use `tools_json = "[]"` and an English
query padded to the exact count (the shortest prompt needle-rs can express is 13 tokens);
the tool prompt is two tools plus a natural query.

**EOS.** needle-rs stops at EOS or `<|im_end|>` (`stop_reason` `Eos` / `ImEnd`) and has no
option to disable that; needlepoint's loop never stops. The bench records needle-rs's
`stop_reason` and actual token count, and all rates are per token actually produced. On
this random-weight archive the greedy continuations of the bench prompts have not hit one
(*Checks* lists this run's stop reasons and token counts).

**Repetitions and interleaving.** One timing process per thread count loads all engines
side by side, warms each up once, then repeats every workload `reps` times; within a
repetition each workload is run by every engine back to back, in an order rotated each
repetition, so drift in machine load hits all engines alike. Figures are medians with
[min–max] over repetitions; ratios are ratios of medians, and the *paired range* is the
min–max of per-repetition ratios (possible because the samples are interleaved). Rates
are computed per sample, then the median is taken.

**Threads.** Each child process starts with `OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS`,
`MKL_NUM_THREADS` and `RAYON_NUM_THREADS` set to the thread count and
`OMP_WAIT_POLICY=passive`; threadpoolctl pins the BLAS pools again inside the process
(`threadpool_limits(n)`). needle-rs is *not* single-threaded: it links rayon and uses the
global rayon pool (default = all cores), which `RAYON_NUM_THREADS` controls; the variable is
read when the pool starts, so the thread count is fixed per process. That is why each thread
count is its own timing process. At 2 threads only the headline workloads and engines run.

**Load time and peak RSS need fresh processes.** Load (archive → first-token-ready) is
measured in a new process per sample (engines alternating): `load()` wall time plus the
first call's excess over a second identical call (lazy initialisation), on the shortest
prompt. The page cache is warm after the first sample, so the archive is read from memory.
needlepoint prepares float32 weights from the archive; it can keep them in a cache file
(`needlepoint.weight_cache`, mapped read-only on later loads), so it is measured twice per
sample, in a fresh temp cache folder: *cold* (no cache file: weights built, the file
written by a background thread that overlaps the first call) and *warm* (the file the cold
process wrote is present). The benchmark never uses ~/.cache; timing processes run with
the cache off. Peak RSS
is a per-process high-water mark (`getrusage(RUSAGE_SELF).ru_maxrss`), so each engine runs
its RSS workload (longest prompt + the decode length) alone in its own process; every such
process imports numpy, needle_rs and needlepoint before loading, so the baselines are equal,
and the table shows the baseline too. Memory-mapped archive pages that are touched count
toward RSS for both engines.

**Machine floor.** In each timing process, before and after the engines run: `sum` over a
512 MiB float64 buffer (DRAM read bandwidth; split over the thread count), `copyto`
(read + write) and `sum` over a 16 MiB buffer repeated (last-level-cache read bandwidth).
The decode floor is the bytes a decode step must stream — every CQ matrix except the engram
tables (gathered: a few rows per token), with the embedding counted in full because it is
the tied LM head; confidence head excluded — divided by the best measured DRAM read
bandwidth. Packed decode weights that fit in the last-level cache (compare the machine line
above) could be served from it, so a cache floor is given as well. The floor bounds an
engine that streams the packed weights once per token; an engine that keeps dequantized
copies reads more (last column of that table).

**Weight bytes per decode token.** needle-rs runs from the packed archive (load takes
~0.05 s and its peak RSS is about the archive size, so it does not keep dequantized copies):
its figure is the archive's packed decode bytes plus the small FP16/FP32 parameters. For
needlepoint the model's own `decode_weight_bytes` is used if it declares one; otherwise the
bench sums the numpy arrays reachable from the model object (by data pointer), minus those on
a path containing `table`, `confidence` or `tokenizer` — an estimate, listed with its largest
arrays in the JSON.

**Noise.** The reference machine has 2 cores shared with other jobs; medians and the
[min–max] spread are the honest summary, and the 2-thread figures are the noisiest.
"""

RS_API = """\
## needle-rs facts this bench relies on (0.3.1)

* `needle_rs.V3Engine.load(cact_path)`, `.from_bytes(cact_bytes)`,
  `.load_with_depth(path, layers)` (ladder rung); properties `num_layers`, `max_seq_len`.
* `generate(query, tools_json, max_new_tokens=0, temperature=0.0, seed=0, system=None,
  constrain=False, kv_int8=False)` → dict `text`, `tool_call`, `reasoning`, `token_ids`,
  `stop_reason` (`MaxTokens`, `Eos`, `ImEnd`, `ContextFull`, `MaxSeqLen`), `positions`
  (prompt + generated). `max_new_tokens=0` means the default of 256. The prompt length is
  `positions - len(token_ids)`. `tools_json` is inserted verbatim (not parsed).
* `run(query, tools_json)`, `run_json`, `run_scored`, `run_stream(query, tools_json,
  callback(piece))` use default settings (no token limit control); `confidence_for(query,
  tools_json, completion)`, `has_confidence()`, `kv_bytes(seq_len, kv_int8=False)`.
* No raw-token-id input, no logits, no per-step API; no EOS override (stops at EOS and
  `<|im_end|>`); no thread option in the API — threads come from rayon's global pool
  (`RAYON_NUM_THREADS`). Numerics are float32 (`kv_int8=True` quantises q/k/v per head
  only); it does not implement the archive's A8 deploy numerics.
"""


def write_docs(results: dict, md_path: Path, png_path: Path) -> None:
    note = plot(results, png_path)
    m = results.get("machine", {})
    cfg = results["config"]
    L = []
    L.append("# Benchmarks: needlepoint vs needle-rs\n")
    L.append(
        f"_Generated by `{results.get('command', 'python -m bench')}` on "
        f"{results.get('started')} in {results.get('wall_s', 0):.0f} s. Do not edit: the "
        "text lives in `bench/report.py`, the numbers in "
        f"`bench/results/`{QUICK_NOTE if results.get('quick') else ''}._\n"
    )
    w = results["floor"]["weights"]
    L.append(
        f"* **Archive**: `{results['archive']}` ({w['file_bytes'] / 1e6:.1f} MB; random "
        "weights in the released Needle 3 geometry: d 768, 20 layers, vocab 8192, 121M "
        "parameters, CQ 2-bit matrices, 4-bit embedding)."
    )
    L.append(
        f"* **Machine**: {m.get('cpu')}, {m.get('logical_cpus')} logical CPUs, caches "
        f"{', '.join(f'{k} {v}' for k, v in m.get('caches', {}).items())}, {m.get('memory')}; "
        f"{m.get('platform')}; load average at start "
        f"{', '.join(f'{x:.2f}' for x in results.get('loadavg_start', []))}, at end "
        f"{', '.join(f'{x:.2f}' for x in results.get('loadavg_end', []))}."
    )
    L.append(
        f"* **Software**: Python {m.get('python')}, numpy {m.get('numpy')} "
        f"({'; '.join(m['blas']) if isinstance(m.get('blas'), list) else m.get('blas')}), "
        f"needle-rs {m.get('needle-rs_version')}, needlepoint {m.get('needlepoint_version')}"
        f" (git {m.get('git')})."
    )
    L.append(
        f"* **Run**: {cfg['reps']} interleaved repetitions; thread counts "
        f"{', '.join(map(str, cfg['threads']))}; prefill prompts "
        + ", ".join(f"{p['name']} ({p['length']})" for p in results["prompts"])
        + "; "
        f"decode {cfg['new_tokens']} new tokens; {cfg['load_reps']} fresh processes per "
        "engine for load time."
    )
    busy = []
    for t, raw in sorted(results.get("timing", {}).get("raw", {}).items()):
        la = [x[0] for x in raw.get("loadavg_per_rep", [])]
        if la:
            busy.append(
                f"{t} thread(s): {raw.get('reps_completed')} repetitions, 1-min load average "
                f"{min(la):.1f}–{max(la):.1f}"
                + (f" (**{raw['stopped_early']}**)" if raw.get("stopped_early") else "")
            )
    if busy:
        L.append(
            f"* **Timing phases** (load average above {m.get('logical_cpus')} means the "
            "engines were sharing the cores with other work): " + "; ".join(busy) + "."
        )
    L.append("")
    unav = _unavailable(results)
    if unav:
        L.append(
            "**Not measured in this run** (the harness includes them automatically once "
            "they work):\n"
        )
        for e, err in unav.items():
            L.append(f"* {LABEL.get(e, e)}: `{err}`")
        L.append("")

    L.append("## Headline: needlepoint (deploy numerics) vs needle-rs\n")
    L.append(
        "Ratios are needlepoint / needle-rs (for tok/s higher is better; for time, memory "
        "and bytes lower is better). Cells are wall-clock median [min–max] over "
        "repetitions; *paired* is the min–max of per-repetition ratios; *ratio (CPU time)* "
        "uses process CPU time instead of wall time, which on a shared machine excludes time "
        "spent waiting for a core (meaningful at 1 thread; at 2 threads spinning BLAS or rayon "
        "threads inflate it).\n"
    )
    hdr = [
        "figure",
        "threads",
        "needle-rs",
        "needlepoint",
        "ratio",
        "paired",
        "ratio (CPU time)",
        "target",
        "met",
    ]
    for np_name in (NP_DEPLOY, NP_FLOAT):
        if np_name not in results.get("engines", []):
            continue
        if np_name == NP_FLOAT:
            L.append("\n### needlepoint float numerics vs needle-rs\n")
            L.append(
                "needle-rs computes in float32 (it does not implement the A8 deploy "
                "numerics), so this is the like-for-like arithmetic comparison; the "
                "headline above is what needlepoint runs by default.\n"
            )
        rows = headline_rows(results, np_name)
        L.append(
            _table(
                hdr,
                [
                    [
                        r[k]
                        for k in (
                            "figure",
                            "threads",
                            "needle_rs",
                            "needlepoint",
                            "ratio",
                            "paired",
                            "ratio_cpu",
                            "target",
                            "met",
                        )
                    ]
                    for r in rows
                ],
            )
        )
    L.append("")

    L.append("\n## Decode against the machine's floor\n")
    fl = results["floor"]
    L.append(
        f"A decode step streams {w['decode_cq_bytes'] / 1e6:.2f} MB of packed CQ matrices "
        f"(all but the engram tables; the embedding counted once as the tied LM head), "
        f"gathers {w['decode_gathered_bytes']} bytes of embedding/engram rows and reads "
        f"{w['decode_small_param_bytes'] / 1e6:.2f} MB of small FP16/FP32 parameters "
        f"(total {w['decode_total_bytes'] / 1e6:.2f} MB). Largest matrices: "
        + ", ".join(
            f"{k} {v / 1e6:.2f} MB" for k, v in list(w["decode_cq_bytes_by_matrix"].items())[:6]
        )
        + ".\n"
    )
    rows = []
    for t, f in sorted(fl.get("per_threads", {}).items()):
        rows.append(
            [
                t[1:],
                f"{f['read_GBps_median']:.1f} (best {f['read_GBps_best']:.1f})",
                f"{f['copy_GBps_median']:.1f}",
                f"{f['cache_read_GBps_median']:.1f} (best {f['cache_read_GBps_best']:.1f})",
                f"{f['floor_decode_ms_dram']:.2f} ms ({f['floor_decode_tok_s_dram']:.0f} tok/s)",
                f"{f['floor_decode_ms_cache']:.2f} ms",
            ]
        )
    L.append(
        _table(
            [
                "threads",
                "DRAM read GB/s",
                "copy GB/s (r+w)",
                "L3-sized read GB/s",
                "decode floor (DRAM, best bw)",
                "decode floor (cache)",
            ],
            rows,
        )
    )
    rows = []
    for e, d in results.get("decode_vs_floor", {}).items():
        for t, f in sorted(d.items()):
            own = f.get("engine_weight_bytes")
            own_ms = f.get("floor_ms_engine_bytes")
            rows.append(
                [
                    LABEL.get(e, e),
                    t[1:],
                    f"{f['decode_ms_per_token']:.2f} (best {f['decode_ms_per_token_best']:.2f})",
                    f"{f['multiple_of_dram_floor']:.1f}×",
                    f"{f['multiple_of_cache_floor']:.1f}×",
                    f"{own / 1e6:.1f} MB → {own_ms:.2f} ms" if own and own_ms else "—",
                ]
            )
    L.append("")
    L.append(
        _table(
            [
                "engine",
                "threads",
                "decode ms/token, median (best)",
                "× DRAM floor",
                "× cache floor",
                "engine's own weight bytes/token → DRAM time",
            ],
            rows,
        )
    )
    L.append(
        "\nThe last column is the floor implied by what the engine actually streams per token "
        "(needle-rs: the packed archive; needlepoint: see *Weight bytes per decode token* "
        "under Method) at the best measured DRAM bandwidth.\n"
    )

    L.append("\n## Prefill by prompt length\n")
    if note:
        L.append(f"_{note}_\n")
    else:
        L.append(f"![prefill and decode tokens/s by prompt length]({png_path.name})\n")
    names = [p["name"] for p in results["prompts"]]
    for t in cfg["threads"]:
        summ = _tsum(results, t)
        engines = [e for e in results["engines"] if summ.get(e, {}).get("workloads")]
        if not engines:
            continue
        rows = []
        for name in names:
            row = [f"{name} ({_prompt_len(results, name)})"]
            have = False
            for e in engines:
                wl = summ[e]["workloads"].get(f"prefill:{name}")
                have |= wl is not None
                row.append(_range(wl["tok_s"]) if wl else "—")
            if have:
                rows.append(row)
        row = [f"decode ({cfg['new_tokens']} steps)"]
        for e in engines:
            wl = next((w for k, w in summ[e]["workloads"].items() if k.startswith("decode:")), None)
            row.append(_range(wl["tok_s"]) if wl else "—")
        rows.append(row)
        L.append(f"**{t} thread{'s' if t > 1 else ''}**, tokens/s median [min–max]:\n")
        L.append(_table(["prompt (tokens)"] + [LABEL.get(e, e) for e in engines], rows))
        L.append("")
        marg = {e: _marginal(results, e, t) for e in engines}
        spans = next((m for m in marg.values() if m), [])
        if spans:
            L.append(
                "Prefill cost per added prompt token between consecutive prompt lengths "
                "(ms/token, from the medians; compare with the decode ms/token above):\n"
            )
            L.append(
                _table(
                    ["engine"] + [span for span, _ in spans],
                    [
                        [LABEL.get(e, e)] + [f"{ms:.2f}" for _, ms in marg[e]]
                        for e in engines
                        if marg[e]
                    ],
                )
            )
            L.append("")
    tok = results.get("tokenize_s_longest")
    if isinstance(tok, float):
        L.append(
            f"needlepoint's prefill figures exclude tokenization (needle-rs's include "
            f"its own): encoding the longest prompt with the archive tokenizer takes "
            f"{tok * 1e3:.1f} ms in Python (first call of a fresh tokenizer).\n"
        )

    L.append("\n## Load time and memory\n")
    rows = []
    for e in _with_cached(results["engines"]):
        s = results["load"]["summary"].get(e)
        if not s and e not in results["engines"]:
            continue
        if not s:
            rows.append([LABEL.get(e, e), "unavailable", "", "", ""])
            continue
        rows.append(
            [
                LABEL.get(e, e),
                _range(s["load_s"], 3),
                _range(s["cold_first_call_s"], 3),
                _range(s["warm_call_s"], 3),
                _range(s["load_to_ready_s"], 3),
            ]
        )
    L.append(
        _table(
            [
                "engine",
                "load() s",
                "first call s (cold)",
                "second call s (warm)",
                "archive → first-token-ready s",
            ],
            rows,
        )
    )
    L.append("")
    rows = []
    for e in _with_cached(results["engines"]):
        r = results["rss"].get(e, {})
        if not r and e not in results["engines"]:
            continue
        if not r.get("available"):
            rows.append([LABEL.get(e, e), "unavailable", "", "", "", ""])
            continue
        wl = r["workload"]
        rows.append(
            [
                LABEL.get(e, e),
                _mib(r["baseline_rss_bytes"]),
                _mib(r["after_load_rss_bytes"]),
                _mib(r["peak_rss_bytes"]),
                _mib(r["peak_minus_baseline_bytes"]),
                f"{wl['prompt_tokens']} + {wl['new_tokens']} tokens, {wl['seconds']:.1f} s",
            ]
        )
    L.append(
        _table(
            [
                "engine",
                "baseline RSS (imports)",
                "RSS after load",
                "peak RSS",
                "peak − baseline",
                "workload",
            ],
            rows,
        )
    )
    L.append("")
    for e in (NP_DEPLOY, NP_FLOAT):
        wgt = results["rss"].get(e, {}).get("weights")
        if wgt and "resident_array_bytes" in wgt:
            L.append(
                f"{LABEL[e]}: {_mb(wgt['resident_array_bytes'])} of numpy arrays reachable "
                f"from the model ({_mb(wgt['estimated_decode_weight_bytes'])} excluding "
                f"engram tables / confidence head / tokenizer; declared "
                f"`decode_weight_bytes`: {_mb(wgt['declared_decode_weight_bytes'])}).\n"
            )

    L.append("\n## Checks\n")
    ch = results.get("checks", {})
    pt = ch.get("prompt_tokens", [])
    bad = [x for x in pt if not x["match"]]
    L.append(
        f"* Prompt lengths: needle-rs reported the same prompt length as the ids given "
        f"to needlepoint for {len(pt) - len(bad)} of {len(pt)} workloads"
        + (
            ": mismatches "
            + ", ".join(
                f"{x['workload']} ({x['needle_rs_reported']} vs {x['ids_sent_to_needlepoint']})"
                for x in bad
            )
            if bad
            else ""
        )
        + f". Prompt ids from: {results.get('tokenizer_source')}."
    )
    for x in ch.get("needle_rs_decode", []):
        L.append(
            f"* needle-rs decode at {x['threads']} thread(s): stop reason "
            f"{', '.join(x['stop_reason'] or [])}, {x['tokens_generated']} tokens generated "
            f"(n + 1 requested)."
        )
    ft = ch.get("first_token", [])
    for e in (NP_FLOAT, NP_DEPLOY):
        sel = [x for x in ft if x["engine"] == e]
        if sel:
            agree = sum(x["agree"] for x in sel)
            L.append(
                f"* First greedy token, {LABEL[e]} vs needle-rs: {agree} of {len(sel)} "
                f"prompts agree"
                + (
                    " (float must agree: same ids, same arithmetic)"
                    if e == NP_FLOAT
                    else " (deploy may differ: A8 numerics)"
                )
                + "."
            )
    for x in ch.get("decode", []):
        L.append(
            f"* Decode greedy tokens, {LABEL[x['engine']]} vs needle-rs ({x['threads']} "
            f"thread(s)): first {x['greedy_tokens_agreeing_from_start']} of {x['of']} agree."
        )
    L.append("")
    for t in cfg["threads"]:
        for e, s in _tsum(results, t).items():
            for n in s.get("notes", []):
                L.append(f"* {LABEL.get(e, e)}, {t} thread(s): {n}")
    L.append("")
    L.append(METHOD)
    L.append(RS_API)
    L.append("## Reproduce\n")
    L.append(
        "```\npip install -e . -r bench/requirements.txt\n"
        "python -m bench            # full run (~10 min on 2 cores): JSON + this page + plot\n"
        "python -m bench --quick    # smoke run (<2 min): bench/results/<fixture>-quick.json\n"
        "python -m bench --report-only bench/results/shipped.json   # re-render this page\n"
        "```\n"
    )
    L.append(
        "Options: `--reps N`, `--threads 1,2`, `--lengths 16,64,...`, `--new-tokens N`, "
        "`--engines needle-rs,needlepoint-deploy,needlepoint-float`, `--fixture NAME` or "
        "`--archive PATH`, `--no-docs`. The archive is found like the tests find "
        "fixtures: `$NEEDLEPOINT_SHARED`, else `../shared` beside the repository.\n"
    )
    text = "\n".join(L)
    text = re.sub(r"\n{3,}", "\n\n", text)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
