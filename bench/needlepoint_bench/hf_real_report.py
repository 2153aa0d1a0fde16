"""The section `HEADING` of `docs/benchmarks_hf.md` from the record `bench.hf_real` measured
(`bench/results/hf_real.json`), with an earlier record beside it when there is one."""

from __future__ import annotations

from .tables import markdown_table

HEADING = "## Real files: Qwen2.5-Coder-0.5B, Gemma 3 270M, SmolLM2 (needlepoint-bench-hf-real)"
NOTES = """\
### Notes

* Method: `bench/needlepoint_bench/hf_real.py` (docstring). Each engine runs every job in a
  fresh process, the engines alternating within a round; the best round per engine is kept,
  every round is in the JSON with the load average at its start.
* Peak RSS is `ru_maxrss` of the child (`wait4`), which Linux carries over from the parent
  image at fork/exec: it is at least the parent's own peak, recorded as `parent_maxrss_mb`
  in the JSON (the parent never holds a model or logits; every child here is bigger). The
  child's own `VmHWM` is in the JSON too.
* Load: warm is the file read through once before the process starts, then file to model
  (`needlepoint.load`, `llama_cpp.Llama(...)`). Cold drops the file's pages with
  `posix_fadvise(DONTNEED)` first (the resident fraction after the drop, from `mincore`, is
  shown; a drop is a request, so a load is cold only where it is ~0) and counts load plus
  the first token: llama.cpp maps the file and reads pages as the first evaluation touches
  them, so its constructor alone would hide the reading.
* Fidelity: needlepoint float (every matrix dequantised to float32) is the reference; the
  logits at every 32nd position and the last of four teacher-forced prompts (prose, code, a
  tool call, a technical text; `hf_real_prompts.py`), max and mean |difference| over all
  those logits, top-1 agreement over those positions.
* Peers: `needlepoint-bench-build-peers` (`bench/needlepoint_bench/peer_build.py`; `--check`
  prints the state and the commands) builds what is missing from llama-cpp-python's sdist
  (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`), always with
  `CFLAGS`/`CXXFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"` (ggml builds with
  `-march=native`; on Intel CPUs that report AMX its AMX kernels crash, and these flags, not
  `GGML_AMX_*=OFF`, remove them), `CMAKE_BUILD_PARALLEL_LEVEL=1` and `nice -n 19`: the
  binding by `pip install SDIST` with `CMAKE_ARGS="-DLLAVA_BUILD=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF"`, and `llama-server` by cmake from the
  sdist's `vendor/llama.cpp` (`-DLLAMA_BUILD_SERVER=ON`, no curl/OpenSSL/web UI download,
  `cmake --build ... --target llama-server -j 1`) into
  `~/.cache/needlepoint-bench/llama-server/build/bin/`. `needlepoint-bench-hf-real
  --build-peer` builds the binding first when it is missing.
* Before / after: *before* is the `--quick` run (256-token prompt, 32 steps, 1 thread) of the
  tree that first multiplied the file's own blocks in place (`kernels/wtypes.py`,
  `kernels/blockweight.py`, `kernels/native/np_wt.h`); *after* is the full run (500-token
  prompt, 128 steps, 1 and 2 threads) after the one-row decode path per type, A16 queries
  and keys, and the int8 weight cache. The settings differ, so compare ratios, not tok/s.
  The earliest tree (every matrix converted at load into the interleaved int8 layout, Q6_K
  dequantised and requantised, keys at 8 bits) loaded Qwen in 14.9 s at 1,879 MB peak RSS
  and its int8 logits were 3.54 from float at worst (llama.cpp: 0.54): the 8-bit keys (a
  few channels made 50x the rest by Qwen's k bias) and, on Gemma, the 8-bit queries
  (docs/numerics.md). Load, peak RSS and fidelity are not timing-sensitive.
* Speed: a 2-core machine shared with other work (the load average is printed above; the
  spread over rounds is in the paragraph under the 2-thread table), so one run's ratios move
  by 10-20 % and 2-thread figures least reliable of all (any engine's second thread waits
  for the other work). Decode is about llama.cpp's speed at 1 thread (Qwen 1.07x, Gemma
  0.86x; target 2x) and the product kernels are most of a step: over the file's blocks at
  one row they are compute-bound on unpacking the codes, not on memory (Qwen's ~490 MB of
  weights per token stream in ~25 ms; a step takes ~32 ms). Prefill is 0.9-1.1x (target
  2x). Next steps: 16-row AVX-512 tiles per type for one row (the codes unpacked once per
  16 rows, as the Needle lookup kernels do), Gemma's block (q/k norms, sliding windows) in
  the fused native call, and a quiet machine for the 2-thread figures.
* Rerun: `needlepoint-bench-hf-real` (`--quick` for 1 round of a 256-token prompt and 32
  steps, `--threads 1`, `--models ...`); copy `bench/results/hf_real.json` to
  `hf_real-before.json` first to get the before/after table.
"""


def _f(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _x(entry: dict, key: str, baseline: str) -> str:
    value = entry.get(f"x_{baseline}", {}).get(key)
    return "" if value is None else f"{value:.2f}"


def _cold(result: dict, engine: str) -> str:
    entry = result.get("cold_load", {}).get(engine)
    if not entry:
        return ""
    resident = [r.get("resident_before") for r in entry["rounds"]]
    shown = max((r for r in resident if r is not None), default=None)
    best = entry["best"]
    text = f"{best['load_s'] + best['first_token_s']:.2f}"
    return text + (f" ({shown:.0%} resident)" if shown is not None else " (residency unknown)")


def _speed(record: dict) -> list[str]:
    baseline = record["baseline"]
    short = baseline.removeprefix("needlepoint-")
    lines = []
    for threads in map(str, record["threads"]):
        rows = []
        for model, result in record["results"].items():
            engines = result.get("speed", {}).get(threads, {})
            for engine, entry in engines.items():
                b = entry["best"]
                rows.append([model, engine, _f(b["load_s"], 2),
                             _cold(result, engine) if threads == str(record["threads"][0])
                             else "", _f(b["peak_rss_mb"], 0), _f(b["prefill_tok_s"]),
                             _f(b["decode_tok_s"]), _x(entry, "prefill_tok_s", baseline),
                             _x(entry, "decode_tok_s", baseline),
                             _x(entry, "peak_rss_mb", baseline), _x(entry, "load_s", baseline)])
        lines += [f"#### {threads} thread{'' if threads == '1' else 's'}", ""]
        lines += markdown_table(["model", "engine", "load s (warm)", "cold load + 1st token s",
                                 "peak RSS MB", "prefill tok/s", "decode tok/s",
                                 f"prefill x {short}", f"decode x {short}", f"RSS x {short}",
                                 f"load x {short}"], rows, align="llrrrrrrrrr") + [""]
    return lines


def _spread(record: dict) -> list[str]:
    """Each engine's range over its rounds, and the load average at the processes' starts:
    how much the shared machine moved the figures."""
    parts, loads = [], []
    for model, result in record["results"].items():
        for threads, engines in result.get("speed", {}).items():
            for engine, entry in engines.items():
                rounds = entry["rounds"]
                loads += [r["loadavg"][0] for r in rounds if r.get("loadavg")]
                if len(rounds) < 2:
                    continue
                pre = [r["prefill_tok_s"] for r in rounds]
                dec = [r["decode_tok_s"] for r in rounds]
                parts.append(f"{model} {engine} at {threads}: prefill {min(pre):.0f}-"
                             f"{max(pre):.0f}, decode {min(dec):.1f}-{max(dec):.1f}")
    lines = []
    if loads:
        lines.append(f"1-minute load average at the speed processes' starts: {min(loads):.1f}"
                     f"-{max(loads):.1f} on {record['machine'].get('logical_cpus')} "
                     "logical CPUs.")
    if parts:
        lines.append("Spread over the rounds (tok/s): " + "; ".join(parts) + ".")
    return [" ".join(lines), ""] if lines else []


def _fidelity(record: dict) -> list[str]:
    rows = []
    for model, result in record["results"].items():
        for pair, entry in result.get("fidelity", {}).items():
            if entry.get("positions"):
                rows.append([model, pair, f"{entry['top1_agreement']:.3f}",
                             f"{entry['max_abs_diff']:.3f}", f"{entry['mean_abs_diff']:.4f}",
                             str(entry["positions"])])
    lengths = {m: r.get("fidelity_prompts", {}) for m, r in record["results"].items()}
    described = "; ".join(f"{m}: " + ", ".join(f"{k} {v}" for k, v in p.items())
                          for m, p in lengths.items() if p)
    return (["### Fidelity (1 thread; reference: needlepoint float)", "",
             f"Prompt lengths in tokens: {described}.", ""]
            + markdown_table(["model", "pair", "top-1 agreement", "max abs diff",
                              "mean abs diff", "positions"], rows, align="llrrrr") + [""])


def _before_after(record: dict, before: dict | None) -> list[str]:
    if not before:
        return []
    baseline = record["baseline"]
    rows = []
    for model, result in record["results"].items():
        old_result = before.get("results", {}).get(model, {})
        for threads, engines in result.get("speed", {}).items():
            for engine, entry in engines.items():
                old = old_result.get("speed", {}).get(threads, {}).get(engine)
                if old is None:
                    continue
                cells = [model, engine, threads]
                for key, digits in (("load_s", 2), ("peak_rss_mb", 0), ("prefill_tok_s", 1),
                                    ("decode_tok_s", 1)):
                    cells += [f"{_f(old['best'][key], digits)} ({_x(old, key, baseline)}x)",
                              f"{_f(entry['best'][key], digits)} ({_x(entry, key, baseline)}x)"]
                rows.append(cells)
    head = ["model", "engine", "threads"]
    for name in ("load s", "peak RSS MB", "prefill tok/s", "decode tok/s"):
        head += [f"{name} before", "after"]
    return (["### Before and after", "",
             f"*Before*: {before.get('started')} (git {before.get('machine', {}).get('git')}). "
             f"*After*: {record.get('started')} (git {record['machine'].get('git')}). In "
             f"brackets each figure x {baseline} in its own run.", ""]
            + markdown_table(head, rows) + [""])


def _load(record: dict, when: str) -> str:
    values = record.get("load_average", {}).get(when)
    return ", ".join(f"{v:.2f}" for v in values) if values else "unrecorded"


def _errors(record: dict) -> list[str]:
    lines = []
    for model, result in record["results"].items():
        for what, text in result.get("errors", {}).items():
            last = text.strip().splitlines()[-1] if text.strip() else "?"
            lines.append(f"* {model}, {what}: `{last[:200]}`")
    return (["### Failed jobs", "", *lines, ""]) if lines else []


def report(record: dict, before: dict | None = None) -> str:
    m = record["machine"]
    build = record.get("llama_cpp_build", {})
    mode = "`--quick`: " if record.get("quick") else ""
    lines = [HEADING, "",
             "_Generated by `needlepoint-bench-hf-real` "
             f"({record['started']}, {record['wall_s']:.0f} s); do not edit: the text lives in "
             "`bench/needlepoint_bench/hf_real_report.py`._", "",
             f"{mode}{record['rounds']} round(s) per engine and thread count (best kept), "
             f"{record['reps']} prefill(s) per process (fastest kept) of a "
             f"{record['prompt_tokens']}-token prompt, then {record['decode_tokens']} decode "
             f"steps. Ratios are x {record['baseline']} in this run.", "",
             f"* CPU: {m.get('cpu')} ({m.get('logical_cpus')} logical CPUs), memory "
             f"{m.get('memory')}",
             f"* int8 kernels: {m.get('native_variant')} variant; needlepoint at git "
             f"{m.get('git')}",
             f"* llama-cpp-python {m.get('llama_cpp_python_version')}, built from its sdist "
             f"with CFLAGS/CXXFLAGS=\"{build.get('CFLAGS')}\" (ggml's -march=native), "
             f"CMAKE_ARGS=\"{build.get('CMAKE_ARGS')}\" (`needlepoint-bench-build-peers`); "
             f"its system info: `{m.get('llama_cpp_system_info')}`",
             f"* load average (1, 5, 15 min) at the start: {_load(record, 'start')}; at the "
             f"end: {_load(record, 'end')} (shared machine)", ""]
    lines += _speed(record) + _spread(record) + _fidelity(record) + _before_after(record, before)
    lines += _errors(record) + NOTES.splitlines()
    return "\n".join(lines) + "\n"
