"""The measured sections of `docs/benchmarks.md`: the headline comparison tables, decode
against the machine's floor, prefill by prompt length, and load time and memory."""

from __future__ import annotations

from pathlib import Path

from .engines import NP_DEPLOY, NP_FLOAT
from .prompts import TOOL_PROMPT_NAME
from .report_format import (
    LABEL,
    _mb,
    _met,
    _mib,
    _num,
    _prompt_len,
    _range,
    _ratio,
    _table,
    _target_text,
    _tsum,
    _with_cached,
)


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


def headline_section(results: dict) -> list[str]:
    """Headline tables: each needlepoint numerics mode vs needle-rs, with targets."""
    L = []
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
    return L


def floor_section(results: dict) -> list[str]:
    """Decode time per token against the machine's memory-bandwidth floor."""
    w = results["floor"]["weights"]
    L = []
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
    return L


def prefill_section(results: dict, note: str | None, png_path: Path) -> list[str]:
    """Prefill (and decode) tokens/s by prompt length, per thread count, and the plot."""
    cfg = results["config"]
    L = []
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
    return L


def load_memory_section(results: dict) -> list[str]:
    """Load time (archive to first-token-ready) and peak RSS per engine."""
    L = []
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
    return L
