"""`docs/benchmarks_server.md` from the load benchmark's result files
(`bench/results/load_*.json`, one per model and mode). Everything above the `<!-- notes -->`
line is generated; the hand-written notes after it are kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .load_memory import summary as summary_of
from .tables import markdown_table

MARKER = "<!-- notes -->"
TARGETS = {"scaling": 4.0, "ttft": 2.0}
LIST_RSS_S = 300  # soaks up to this long list RSS every 10 s; longer ones get a table
TABLE_EVERY = 30  # samples (10 s apart) between two rows of that table: 5 minutes


def _mode(result: dict[str, Any]) -> str:
    spec = (", speculative decoding on (drafts verified by extend)" if result.get("speculate",
                                                                             True)
            else ", no speculative decoding (`--no-speculate`)")
    if not result.get("batching"):
        return "no batching (each request on its own worker thread and session)" + spec
    if result.get("batched"):
        return "continuous batching, one `model.run_batch` call per engine step" + spec
    return "continuous batching, each item of a step run alone (no run_batch)" + spec


def _load(result: dict[str, Any]) -> str:
    load = result.get("loadavg")
    if not load:
        return ""
    return (f" and with other work (1-minute load average {load['start']:.1f} at the start, "
            f"{load['end']:.1f} at the end)")


def _verdict(value: float, target: float, higher: bool) -> str:
    met = value >= target if higher else value <= target
    sign = ">=" if higher else "<="
    return f"{value:.2f}x (target {sign} {target:g}x: {'met' if met else 'not met'})"


def section(result: dict[str, Any]) -> str:
    phases = result["phases"]
    lines = [f"## {result['label']}: {result['model']}", "",
             f"Mode: {_mode(result)}. Server: `--workers {result['workers']} --max-queue "
             f"{result['max_queue']}`. Machine: {result['machine']}; the clients share the "
             "CPUs with the server" + _load(result) + ".", "",
             f"Command: `{result['command']}`", ""]
    if "scaling" in phases:
        scale = phases["scaling"]
        lines += [f"**Decode throughput** (text requests, `max_tokens` {scale['max_tokens']}, "
                  "short prompts, each client looping):", ""]
        lines += markdown_table(
            ["clients", "requests", "completion tokens", "tokens/s",
             "sessions per engine step", "errors"],
            [[run["clients"], run["requests"], run["tokens"], f"{run['tokens_per_s']:.1f}",
              "-" if run["mean_batch"] is None else f"{run['mean_batch']:.1f}",
              ", ".join(f"{k}: {v}" for k, v in run["errors"].items()) or "none"]
             for run in scale["runs"]])
        rounds = ", ".join(f"{r:.2f}" for r in scale.get("round_ratios", []))
        lines += ["", f"16 clients vs 1 (median of {scale.get('rounds', 1)} alternating rounds: "
                  f"{rounds}): {_verdict(scale['ratio'], TARGETS['scaling'], True)}", ""]
    if "ttft" in phases:
        t = phases["ttft"]
        lines += [f"**Time to first token** of a new request ({t['probes']} tool-calling "
                  "requests from the eval set, 2-4 tools, streamed with `max_tokens` 1, one at a "
                  "time, alone and loaded in alternating rounds; time to the first chunk):", "",
                  "| | p50 | p90 |", "|---|---|---|",
                  f"| alone | {t['alone_p50_s'] * 1000:.0f} ms | - |",
                  f"| while {t['background']} others decode | {t['loaded_p50_s'] * 1000:.0f} "
                  f"ms | {t['loaded_p90_s'] * 1000:.0f} ms |", "",
                  f"Loaded vs alone (p50 per round, median of {t.get('rounds', 1)} rounds: "
                  f"{', '.join(f'{r:.2f}' for r in t.get('round_ratios', []))}): "
                  f"{_verdict(t['ratio'], TARGETS['ttft'], False)}", ""]
    if "soak" in phases:
        s = phases["soak"]
        errors = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none"
        batch = "-" if s["mean_batch"] is None else f"{s['mean_batch']:.1f}"
        rss = " / ".join(str(v) for v in s["rss_every_10s_mib"])
        lines += [f"**Soak**: {s['clients']} clients for {s['load_s']:.0f} s "
                  f"({s['duration_s']:.0f} s until the requests in flight at the deadline had "
                  f"finished; rates are over the latter), looping over {s['distinct_requests']} "
                  "tool-calling requests from `needle3-toy.eval.jsonl` (2-4 tools each), every "
                  "4th streamed, greedy; every answer checked against the same request alone.",
                  ""]
        metrics = [
            ("requests completed", s["requests_ok"]),
            ("requests/s", f"{s['requests_per_s']:.1f}"),
            ("completion tokens/s", f"{s['completion_tokens_per_s']:.0f}"),
            ("sessions per engine step (mean)", batch),
            ("latency of one request alone, p50",
             f"{s['unloaded_latency_p50_s'] * 1000:.0f} ms"),
            ("latency p50 / p99", f"{s['latency_p50_s'] * 1000:.0f} ms / "
                                  f"{s['latency_p99_s'] * 1000:.0f} ms"),
            ("streamed: first chunk p50 / p99", f"{s['stream_ttft_p50_s'] * 1000:.0f} ms / "
                                                f"{s['stream_ttft_p99_s'] * 1000:.0f} ms"),
            ("errors", errors),
            ("wrong answers (differ from the request alone)", s["wrong_answers"]),
            ("peak admitted in flight", s["peak_in_flight"]),
            ("server RSS after loading / max sampled under load",
             f"{result['rss_after_load_mib']:.0f} MiB / {s['rss_max_sampled_mib']:.0f} MiB"),
            *([("RSS every 10 s (MiB)", rss)] if s["load_s"] <= LIST_RSS_S
              or "memory" not in s else []),
            ("server peak RSS (VmHWM)", f"{result['peak_rss_mib']:.0f} MiB")]
        lines += markdown_table(["metric", "value"], metrics) + [""]
        lines += memory_lines(s)
    return "\n".join(lines)


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _per_10min(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f} MiB per 10 min"


def memory_lines(soak: dict[str, Any]) -> list[str]:
    """The soak's memory (`bench/load_memory.py`): RSS at the start, after warm-up, at the
    end, the last 40 minutes' slopes, and for a long soak a row every 5 minutes."""
    m = soak.get("memory")
    if not m and soak["load_s"] > LIST_RSS_S:  # an older result: from its RSS list (whole MiB,
        rss = soak["rss_every_10s_mib"]  # no timestamps: spread evenly over the soak)
        m = summary_of([(soak["load_s"] * i / len(rss), v * 2**20) for i, v in enumerate(rss)],
                       [])
    if not m:
        return []
    window = m["slope_window_s"] / 60
    lines = ["**Memory over the soak** (server RSS from /proc every second; C heap from its "
             "/metrics, glibc `mallinfo2`: bytes in use, and bytes held free in the arenas; "
             f"slopes: least squares over the last {window:.0f} min):", ""]
    lines += markdown_table(
        ["RSS start", "after 5 min warm-up", "end", "RSS slope", "heap-in-use slope"],
        [[f"{_mib(m['rss_start_mib'])} MiB", f"{_mib(m['rss_after_warmup_mib'])} MiB",
          f"{_mib(m['rss_end_mib'])} MiB", _per_10min(m["rss_slope_mib_per_10min"]),
          _per_10min(m["heap_in_use_slope_mib_per_10min"])]]) + [""]
    samples = soak.get("samples_every_10s", [])
    rss = soak["rss_every_10s_mib"]
    if soak["load_s"] <= LIST_RSS_S or not samples:
        return lines
    table = []
    for k in range(0, len(samples), TABLE_EVERY):
        sample = samples[k]
        heap = [_mib(sample[key] / 2**20 if key in sample else None) for key in ("in_use", "free")]
        table.append([f"{sample['t'] / 60:.0f}", rss[min(k, len(rss) - 1)], *heap,
                      f"{sample['loadavg']:.1f}"])
    return lines + markdown_table(["minute", "RSS (MiB)", "heap in use (MiB)", "heap free (MiB)",
                                   "load average"], table) + [""]


def summary(results: list[dict[str, Any]]) -> str:
    """One line per result: the three targets side by side."""
    rows = []
    for r in results:
        p = r["phases"]
        scale = p.get("scaling")
        scaled = (f"{scale['ratio']:.2f}x ({scale['runs'][0]['tokens_per_s']:.0f} -> "
                  f"{scale['runs'][1]['tokens_per_s']:.0f})" if scale else "-")
        ttft = p.get("ttft")
        first = (f"{ttft['ratio']:.2f}x ({ttft['alone_p50_s'] * 1000:.0f} / "
                 f"{ttft['loaded_p50_s'] * 1000:.0f} ms)" if ttft else "-")
        soak = p.get("soak")
        soaked = "-"
        if soak:
            errors = sum(soak["errors"].values())
            rss = soak["rss_every_10s_mib"]
            soaked = (f"{soak['requests_per_s']:.1f}, {errors}, {soak['wrong_answers']}, "
                      f"{rss[0]} -> {rss[-1]}" if rss else "")
        batching = ("run_batch" if r.get("batched") else "one by one") if r.get("batching") \
            else "no"
        rows.append([r["label"], batching, "on" if r.get("speculate", True) else "off", scaled,
                     first, soaked])
    return "\n".join(markdown_table(
        ["result", "batching", "speculation", "16 clients vs 1 (decode tokens/s)",
         "TTFT loaded / alone (p50)", "soak: requests/s, errors, wrong answers, RSS (MiB)"],
        rows)) + "\n"


def write_report(paths: list[Path], out: Path) -> None:
    results = [json.loads(p.read_text()) for p in paths]
    for path, result in zip(paths, results, strict=True):
        if path.stem.endswith("-before"):  # an earlier run kept for a before/after reading
            result["label"] += " (before)"
    # the toy model first; batched before not; speculation on before off
    results.sort(key=lambda r: (r["label"].split("-")[0] != "toy", not r.get("batching"),
                                not r.get("speculate", True), r["label"]))
    notes = ""
    if out.exists() and MARKER in out.read_text():
        notes = out.read_text().split(MARKER, 1)[1]
    head = ("# Server load benchmark (`needlepoint-bench-load`)\n\n"
            "`needlepoint serve` on 127.0.0.1 driven by the official `openai` async client "
            "(one process). Phases: decode throughput with 16 clients vs 1, time to first "
            "token of a new request while 15 others decode, and a soak of 64 clients; "
            "targets of the continuous-batching issue in parentheses. Generated from "
            "`bench/results/load_*.json`; notes by hand at the end.\n")
    body = "\n".join(section(r) for r in results)
    out.write_text(f"{head}\n{summary(results)}\n{body}\n{MARKER}{notes or chr(10)}")
