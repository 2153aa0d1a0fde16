"""The section `HEADING` of `docs/benchmarks_hf.md` from the record `bench.hf_shapes` measured
(`bench/results/hf_shapes.json`): one `## ` section (its parts `###`), so the other writers
of that file (`bench.hf`, `bench.products_i8`) keep it as it is."""

from __future__ import annotations

from .tables import markdown_table

HEADING = "## Real shapes: Qwen3-0.6B and Gemma 3 270M geometry (issue 28 item 5)"
NOTES = """\
### Notes

* The files: random weights (N(0, 0.02), norms 1) in each model's published geometry, a
  synthetic tokenizer of the real vocabulary size (byte-level BPE with pair merges for Qwen,
  SentencePiece-style pieces with byte tokens for Gemma), written by `needlepoint.write_gguf`
  (gguf's `GGUFWriter`, llama.cpp's tensor names and metadata) once into
  `~/.cache/needlepoint-bench/hf-shapes/`. Q4_K_M follows llama.cpp's main rules (tied
  embedding Q6_K, `attn_v` / `ffn_down` Q6_K in the `use_more_bits` layers, else Q4_K; rows
  not a multiple of 256 fall back to Q5_0 / Q8_0: all of Gemma's 640-wide matrices).
  `bench/needlepoint_bench/hf_shapes_models.py` has the details. Speed does not depend on
  the weights' values; the prompt is random token ids (the same for both engines).
* needlepoint int8 runs Q8_0, Q4_K and Q5_0 matrices as stored (one scale, and for Q4_K an
  offset, per 32 values); Q6_K (a scale per 16 values) is dequantised and requantised to
  int8 per 32 at load (docs/hf.md "Numerics (int8)"), so its load takes longer and its RSS
  holds 34 bytes per 32 weights where the file holds 26.25.
* Findings (run of 2026-12-02 02:57 UTC with llama.cpp, load average about 7-9 on the 2
  cores; an earlier needlepoint-only run at load 11 was 2-5x slower, so ratios from one run
  are what count): no file meets all three targets. A cProfile of Qwen3-0.6B Q8_0 decode
  (16-token prompt, 4 steps, own time per function, at load 10) put 1.16 s of 1.61 s in
  `i8.py matmul` (113 products a step: 28 x q|k|v, o, gate|up, down and the 151936-row LM
  head, 165 MB of the 608 MB read per token), 0.11 s in `i8_ops.norm` (452 calls: the q/k
  norms, run from Python), attention 0.07 s. The fused block does not compute Qwen3 /
  Gemma 3 blocks (`int8_fused.kernel_computes`: q/k norms, Gemma's four norms), so
  `int8_fused.fused_blocks` returns None and each block runs kernel by kernel from Python
  (SmolLM2 runs one native call per block); prefill pays the same per-kernel calls and
  float64 epilogues.
* RSS: Gemma's peak is about 1.9x llama.cpp's even in Q8_0 (716 vs 389 MB): not yet broken
  down (candidates: the 262144-row embedding held both as the embedding and as the int8 LM
  head, the tokenizer's Python tables of 262144 pieces).
* Q4_K_M Qwen3: 32 s load and 2.9 GB peak RSS against 5.5 s / 1.0 GB for Q8_0: the tied
  embedding is Q6_K (155 M values), which the int8 path dequantises to float32 (620 MB, plus
  numpy temporaries of the same size) and requantises at load.
* Next steps: (1) the fused native block for specs with per-head q/k norms, Gemma's extra
  norms and gelu-tanh (removes the Python per-kernel calls and the 452 norm calls a step);
  (2) Q6_K run as stored (its 16-value scales as two 32-blocks' worth of int8 scales per
  sub-block pair, or requantised row chunk by row chunk so the float copy never exists
  whole), which bounds Q4_K_M's load time and RSS; (3) an RSS breakdown of the Gemma load;
  (4) rerun on a quiet machine with `--rounds 3` (the defaults also profile every file that
  misses a target).
* Peak RSS is `VmHWM` of the engine's process (load, prefill and decode); load time is file
  to a model ready to run (needlepoint: weights prepared, tokenizer built).
"""


def _ratio(ours: dict, peer: dict | None, key: str) -> str:
    return f"{ours[key] / peer[key]:.2f}" if peer else ""


def _speed(record: dict) -> list[str]:
    rows = []
    for label, result in record["results"].items():
        engines = result["engines"]
        peer = engines.get("llama.cpp", {}).get("best")
        for engine, entry in engines.items():
            b = entry["best"]
            rows.append([label, f"{result['file_mb']:.0f}", engine, f"{b['prefill_tok_s']:.1f}",
                         f"{b['decode_tok_s']:.1f}", f"{b['peak_rss_mb']:.0f}",
                         f"{b['load_s']:.2f}", _ratio(b, peer, "prefill_tok_s"),
                         _ratio(b, peer, "decode_tok_s"), _ratio(b, peer, "peak_rss_mb")])
        for engine, error in result.get("errors", {}).items():
            rows.append([label, f"{result['file_mb']:.0f}", engine,
                         "failed: " + error.strip().splitlines()[-1][:120], "", "", "", "", "",
                         ""])
    return markdown_table(["model / quant", "file MB", "engine", "prefill tok/s",
                           "decode tok/s", "peak RSS MB", "load s", "prefill x llama.cpp",
                           "decode x llama.cpp", "RSS x llama.cpp"], rows) + [""]


def _targets(record: dict) -> list[str]:
    t = record["targets"]
    lines = [f"### Targets (1 thread, needlepoint int8 x llama.cpp: decode >= {t['decode']}x, "
             f"prefill >= {t['prefill']}x, RSS <= {t['rss']}x)", ""]
    for label, result in record["results"].items():
        ours = result["engines"].get("needlepoint-int8", {}).get("best")
        peer = result["engines"].get("llama.cpp", {}).get("best")
        if not ours or not peer:
            lines.append(f"* {label}: no ratio (llama.cpp or needlepoint did not run)")
            continue
        parts = []
        for key, name, want, higher in (("decode_tok_s", "decode", t["decode"], True),
                                        ("prefill_tok_s", "prefill", t["prefill"], True),
                                        ("peak_rss_mb", "RSS", t["rss"], False)):
            ratio = ours[key] / peer[key]
            ok = ratio >= want if higher else ratio <= want
            parts.append(f"{name} {ratio:.2f}x: " + ("met" if ok else "NOT met"))
        lines.append(f"* {label}: " + "; ".join(parts))
    return lines + [""]


def _profiles(record: dict) -> list[str]:
    lines = []
    for label, result in record["results"].items():
        prof = result.get("profile") or {}
        if "fused" not in prof:
            continue
        fused, kernels = prof["fused"], prof["kernels"]
        steps = fused["steps"]
        lines += [f"### Profile: {label}, needlepoint int8 decode", "",
                  f"{steps} steps after the {record['prompt_tokens']}-token prompt, 1 thread: "
                  f"{fused['step_s_unprofiled'] * 1e3:.1f} ms a step as run, "
                  f"{kernels['step_s_unprofiled'] * 1e3:.1f} ms kernel by kernel "
                  "(`model.fused = False`). Own time per function under cProfile, kernel by "
                  "kernel (the native breakdown), then as run:", ""]
        for functions, count in ((kernels["functions"], 10), (fused["functions"], 5)):
            lines += markdown_table(
                ["function (own time)", "calls per step", "ms per step"],
                [[f"`{row['function']}`", f"{row['calls'] / steps:.0f}",
                  f"{row['own_s'] / steps * 1e3:.2f}"] for row in functions[:count]]) + [""]
    return lines


def _load(record: dict, when: str) -> str:
    values = record.get("load_average", {}).get(when)
    return ", ".join(f"{v:.2f}" for v in values) if values else "unrecorded"


def _variants(record: dict) -> str:
    seen = {entry["best"].get("variant") for r in record["results"].values()
            for e, entry in r["engines"].items() if e == "needlepoint-int8"}
    return ", ".join(sorted(str(v) for v in seen if v)) or "unrecorded"


def report(record: dict) -> str:
    m = record["machine"]
    peer = "llama.cpp" in record["engines"]
    lines = [HEADING, "",
             f"_Generated by `needlepoint-bench-hf-shapes` ({record['started']}, "
             f"{record['wall_s']:.0f} s); do not edit: the text lives in "
             "`bench/needlepoint_bench/hf_shapes_report.py`._", "",
             f"1 thread. Prompt {record['prompt_tokens']} tokens (prefill from an empty state, "
             f"best of {record['reps']}), then {record['decode_tokens']} decode steps (tok/s "
             f"from their mean); {record['rounds']} processes per engine and file, "
             "interleaved, best kept. Method: `bench/needlepoint_bench/hf_shapes.py`.", "",
             f"* int8 kernels: {_variants(record)} variant; needlepoint at git {m.get('git')}; "
             f"llama-cpp-python {m.get('llama_cpp_python_version')}",
             f"* CPU: {m.get('cpu')} ({m.get('logical_cpus')} logical CPUs), memory "
             f"{m.get('memory')}",
             f"* load average (1, 5, 15 min) at the start: {_load(record, 'start')}; at the "
             f"end: {_load(record, 'end')} (2 cores, shared with other work)", ""]
    if not peer:
        lines += ["llama.cpp did not run (`--no-peer`, or llama-cpp-python not installed): "
                  "needlepoint's figures only, no ratios.", ""]
    lines += _speed(record) + _targets(record) + _profiles(record)
    return "\n".join(lines + NOTES.splitlines()) + "\n"
