"""Child process of `needlepoint-bench-hf`: one engine, one job, in its own interpreter.

    python -m needlepoint_bench.hf_worker SPEC.json

SPEC: `engine` ("llama.cpp", "needlepoint-float", "needlepoint-int8"), `job` ("speed",
"logits" or "profile"), `gguf`, `threads`, `ids` (the prompt), `decode` (tokens fed one at a
time after the prompt), `reps`, `out` (the result JSON; "logits" also writes `logits_path`).

* speed: load (timed), a warm-up, then `reps` prefills of the whole prompt from an empty state
  (the logits of its last position only), then one decode step per `decode` token, each timed;
  reports the times and the process's peak RSS (`VmHWM` of /proc/self/status: the high-water
  mark of this process image; `ru_maxrss` would also count the parent's RSS at fork time).
* logits: the logits of every prompt position, teacher-forced (llama.cpp with
  `logits_all=True`; needlepoint's `model.forward`), saved as float32 .npy.
* profile: cProfile over needlepoint's decode steps, own time per function: as run, and with
  `model.fused = False` (every kernel called from Python: each one's share).

The thread environment (OMP/OpenBLAS variables, `OMP_WAIT_POLICY=passive`) is set by the
parent before this process starts (`bench.spawn.child_env`).
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from pathlib import Path

import numpy as np  # noqa: E402


class LlamaCpp:
    def __init__(self, gguf: str, threads: int, all_logits: bool = False) -> None:
        import llama_cpp

        self.version = llama_cpp.__version__
        self.llm = llama_cpp.Llama(model_path=gguf, n_ctx=1024, n_threads=threads,
                                   n_threads_batch=threads, n_batch=512, n_ubatch=512,
                                   logits_all=all_logits, verbose=False, seed=0)

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)

    def step(self, token: int) -> None:
        self.llm.eval([token])

    def logits(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)], np.float32)


class Needlepoint:
    def __init__(self, gguf: str, threads: int, numerics: str) -> None:
        import needlepoint

        self.version = getattr(needlepoint, "__version__", "")
        self.model = needlepoint.load(gguf, numerics=numerics, threads=threads)
        self.variant = needlepoint.native_variant()  # the native variant the kernels run
        self.session = None

    def prefill(self, ids: list[int]) -> None:
        self.session = self.model.session()
        self.session.prefill(ids)

    def step(self, token: int) -> None:
        self.session.step(token)

    def logits(self, ids: list[int]) -> np.ndarray:
        return self.model.forward(ids)


def peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make(spec: dict, all_logits: bool = False):
    engine, gguf, threads = spec["engine"], spec["gguf"], int(spec["threads"])
    if engine == "llama.cpp":
        return LlamaCpp(gguf, threads, all_logits)
    return Needlepoint(gguf, threads, engine.removeprefix("needlepoint-"))


def step_times(engine, decode: list[int]) -> list[float]:
    """Seconds of one decode step per token of `decode`."""
    steps = []
    for token in decode:
        t = time.perf_counter()
        engine.step(token)
        steps.append(time.perf_counter() - t)
    return steps


def timed(engine, spec: dict) -> dict:
    """After a warm-up (first-call allocations, caches of small shapes): the seconds of
    `reps` prefills of spec's ids (`prefill_s`) and of a step per decode token (`step_s`)."""
    ids, decode = spec["ids"], spec["decode"]
    engine.prefill(ids[:16])
    for token in decode[:4]:
        engine.step(token)
    prefill = []
    for _ in range(int(spec["reps"])):
        t = time.perf_counter()
        engine.prefill(ids)
        prefill.append(time.perf_counter() - t)
    return {"prefill_s": prefill, "step_s": step_times(engine, decode)}


def speed(spec: dict) -> dict:
    t0 = time.perf_counter()
    engine = make(spec)
    load_s = time.perf_counter() - t0
    return {"load_s": load_s, **timed(engine, spec), "peak_rss_mb": peak_rss_mb(),
            "version": engine.version, "variant": getattr(engine, "variant", None)}


def logits(spec: dict) -> dict:
    engine = make(spec, all_logits=True)
    out = engine.logits(spec["ids"])
    np.save(spec["logits_path"], out.astype(np.float32))
    return {"shape": list(out.shape)}


def _profiled(engine, ids: list[int], decode: list[int]) -> dict:
    import cProfile
    import pstats

    engine.prefill(ids)
    profiler = cProfile.Profile()
    t = time.perf_counter()
    profiler.enable()
    for token in decode:
        engine.step(token)
    profiler.disable()
    wall = time.perf_counter() - t
    rows = []
    for (path, line, name), (_, calls, own, total, _) in pstats.Stats(profiler).stats.items():
        rows.append({"function": f"{Path(path).name}:{line}({name})", "calls": calls,
                     "own_s": own, "cumulative_s": total})
    rows.sort(key=lambda r: -r["own_s"])
    return {"steps": len(decode), "wall_s": wall, "functions": rows[:25]}


def profile(spec: dict) -> dict:
    """cProfile of decode steps: as run (each block one native call), and kernel by kernel
    (`model.fused = False`: the same kernels called from Python, so each one's share shows),
    plus unprofiled step times of both."""
    engine = make(spec)
    ids, decode = spec["ids"], spec["decode"]
    out = {}
    for label, fused in (("fused", True), ("kernels", False)):
        engine.model.fused = fused
        engine.prefill(ids)
        steps = step_times(engine, decode)
        out[label] = _profiled(engine, ids, decode)
        out[label]["step_s_unprofiled"] = float(np.median(steps))
    engine.model.fused = True
    return out


JOBS = {"speed": speed, "logits": logits, "profile": profile}


def main(argv: list[str], jobs: dict = JOBS) -> int:
    """Run the job a spec file names (`jobs`) and write its result (or its error) where the
    spec says: one job per process, so each measures a fresh process."""
    spec = json.loads(Path(argv[0]).read_text())
    try:
        result = jobs[spec["job"]](spec)
    except Exception:  # noqa: BLE001 - reported to the parent
        result = {"job_error": traceback.format_exc()[-3000:]}
    Path(spec["out"]).write_text(json.dumps(result))
    return 0 if "job_error" not in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
