"""needlepoint int8 vs llama.cpp on the real shapes (issue 28 item 5): `needlepoint-bench-hf-shapes`
(console script).

GGUFs in the geometry of Qwen3-0.6B and Gemma 3 270M, random weights and a synthetic
tokenizer of the real vocabulary size (`hf_shapes_models`), as Q8_0 and as a Q4_K_M-style
mix, each run by needlepoint (`numerics="int8"`) and by llama.cpp (llama-cpp-python, bench's
`peers` extra) on the same file, 1 thread, each engine in its own subprocess
(`hf_worker`'s "speed" job, as `needlepoint-bench-hf` runs it):

* prefill: `--prompt` random token ids from an empty state, `--reps` times, the fastest kept;
* decode: then `--decode` single-token steps, tokens/s from their mean;
* load time (file to first call) and peak RSS (`VmHWM`) of the process;
* `--rounds` processes per engine, interleaved, the best kept (the machine is shared:
  interference only slows a run);
* where a target is missed, a cProfile of needlepoint's decode steps (`hf_worker`'s
  "profile" job: as run and kernel by kernel).

The machine is shared, so the defaults are short (a few decode steps, two prefills). The
report is the section `HEADING` of `docs/benchmarks_hf.md`; the record `bench/results/
hf_shapes.json`. Random weights: the speed of a product does not depend on the values, and
nothing here compares logits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import paths
from .hf import run_worker
from .hf_shapes_models import MODELS, QUANTS, TINY, write_model
from .hf_shapes_report import HEADING, report
from .tables import replace_section

ENGINES = ("llama.cpp", "needlepoint-int8")
GGUF_DIR = Path.home() / ".cache" / "needlepoint-bench" / "hf-shapes"


def _best(rounds: list[dict], prompt: int) -> dict:
    return {"prefill_tok_s": max(prompt / min(r["prefill_s"]) for r in rounds),
            "decode_tok_s": max(1.0 / float(np.mean(r["step_s"])) for r in rounds),
            "peak_rss_mb": min(r["peak_rss_mb"] for r in rounds),
            "load_s": min(r["load_s"] for r in rounds),
            "variant": rounds[0].get("variant"), "version": rounds[0].get("version")}


def measure(gguf: Path, engines: list[str], ids: list[int], decode: list[int], reps: int,
            rounds: int, log) -> dict:
    """Every engine's best of `rounds` processes on one file (module doc)."""
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    errors: dict[str, str] = {}
    for round_ in range(rounds):
        for engine in engines:
            log(f"  {engine}, round {round_ + 1}")
            result = run_worker({"gguf": str(gguf), "ids": ids, "decode": decode, "reps": reps,
                                 "engine": engine, "job": "speed", "threads": 1}, 1)
            if "job_error" in result:
                errors[engine] = result["job_error"][-1500:]
                log(errors[engine])
            else:
                runs[engine].append(result)
    out = {e: {"best": _best(rs, len(ids)), "rounds": rs} for e, rs in runs.items() if rs}
    return {"engines": out, "errors": errors, "file_mb": gguf.stat().st_size / 2**20}


def missed(result: dict, targets: dict) -> bool:
    ours, peer = (result["engines"].get(e) for e in ENGINES[::-1])
    if ours is None or peer is None:
        return True
    o, p = ours["best"], peer["best"]
    return (o["decode_tok_s"] < targets["decode"] * p["decode_tok_s"]
            or o["prefill_tok_s"] < targets["prefill"] * p["prefill_tok_s"]
            or o["peak_rss_mb"] > targets["rss"] * p["peak_rss_mb"])


def _perf_available() -> bool:
    from shutil import which

    return which("perf") is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-hf-shapes",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS),
                        choices=[*MODELS, *TINY])
    parser.add_argument("--quants", nargs="+", default=list(QUANTS), choices=QUANTS)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--no-peer", action="store_true", help="needlepoint only (no llama.cpp)")
    parser.add_argument("--prompt", type=int, default=128, help="prefill tokens")
    parser.add_argument("--decode", type=int, default=8, help="decode steps after the prompt")
    parser.add_argument("--reps", type=int, default=2, help="prefills per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per engine")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--gguf-dir", type=Path, default=GGUF_DIR,
                        help="where the generated GGUFs are kept (written once)")
    paths.add_report_arguments(parser, "benchmarks_hf.md", "hf_shapes.json",
                               "the section of --out")
    args = parser.parse_args(argv)
    if args.report_only:
        replace_section(args.out, HEADING, report(json.loads(args.json.read_text())))
        return 0
    engines = [e for e in args.engines if not (args.no_peer and e == "llama.cpp")]
    targets = {"decode": 1.5, "prefill": 3.0, "rss": 1.25}
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    started, load_start = time.time(), os.getloadavg()
    results: dict[str, dict] = {}
    for name in args.models:
        vocab = {**MODELS, **TINY}[name]["vocab_size"]
        rng = np.random.default_rng(1)  # the same ids for every engine and file of a model
        ids = rng.integers(260, vocab - 8, args.prompt + args.decode).tolist()
        for quant in args.quants:
            t = time.time()
            gguf = write_model(name, quant, args.gguf_dir)
            log(f"{name} {quant}: {gguf} ({time.time() - t:.1f} s to write or find)")
            result = measure(gguf, engines, ids[:args.prompt], ids[args.prompt:], args.reps,
                             args.rounds, log)
            if not args.no_profile and missed(result, targets) and "llama.cpp" in engines:
                log("  profile: needlepoint-int8 decode")
                result["profile"] = run_worker(
                    {"gguf": str(gguf), "ids": ids[:args.prompt], "decode": ids[args.prompt:],
                     "engine": "needlepoint-int8", "job": "profile", "threads": 1}, 1)
            results[f"{name} {quant}"] = result
    from .machine import machine_info

    record = {"models": args.models, "quants": args.quants, "engines": engines,
              "prompt_tokens": args.prompt, "decode_tokens": args.decode, "reps": args.reps,
              "rounds": args.rounds, "targets": targets, "results": results,
              "machine": machine_info(), "perf_available": _perf_available(),
              "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
              "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
              "wall_s": time.time() - started}
    try:
        from importlib import metadata

        record["machine"]["llama_cpp_python_version"] = metadata.version("llama-cpp-python")
    except Exception:  # noqa: BLE001 - not installed: --no-peer runs
        record["machine"]["llama_cpp_python_version"] = None
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    text = report(record)
    replace_section(args.out, HEADING, text)
    print(text)
    log(f"wrote {args.out} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
