"""The prefill/decode throughput plot (`docs/benchmarks_prefill.png`)."""

from __future__ import annotations

from pathlib import Path

from .prompts import TOOL_PROMPT_NAME
from .report_format import COLOR, LABEL, _prompt_len, _tsum


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
