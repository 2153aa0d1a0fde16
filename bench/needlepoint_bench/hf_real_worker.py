"""Child process of `needlepoint-bench-hf-real`: one engine, one job, in its own interpreter.

    python -m needlepoint_bench.hf_real_worker SPEC.json

SPEC: `engine` ("llama.cpp", "needlepoint-float", "needlepoint-int8"; the engines are
`hf_worker`'s), `job`, `gguf`, `threads`, `out` (the result JSON), and per job:

* tokenize: `texts` (name -> text) -> `ids` (name -> token ids, needlepoint's tokenizer of
  the file, which adds the BOS its GGUF asks for). Run in a child so the parent, whose memory
  a child's `ru_maxrss` can include, stays small;
* load: load the model and evaluate one token (`ids[:1]`): `load_s` (file to model) and
  `first_token_s` (llama.cpp maps the file and reads pages as the first evaluation touches
  them, so "load" alone would hide the reading);
* speed: load and first token as above, a warm-up, `reps` prefills of `ids` from an empty
  state (`prefill_s`), then one decode step per token of `decode` (`step_s`), and the
  process's `VmHWM` (the parent records `ru_maxrss` from `wait4`);
* fidelity: for each prompt of `prompts` (name -> ids), the logits of every position
  teacher-forced (llama.cpp `logits_all=True`, needlepoint `model.forward`), of which the
  rows `rows(len)` (every 32nd position and the last) are saved to `logits_path` (.npz);
* peer_info: llama-cpp-python's version and llama.cpp's system info (its CPU features);
* compare: `pairs` (label -> [ours .npz, reference .npz]) -> `compare`'s figures per label
  (in a child too: the parent never holds logits).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .hf_worker import main as run_job
from .hf_worker import make, peak_rss_mb, timed

STRIDE = 32  # fidelity: every STRIDE-th position, and the last


def rows(length: int) -> list[int]:
    """The positions compared for fidelity: 0, 32, 64, ... and the last."""
    picked = list(range(0, length, STRIDE))
    return picked if picked[-1] == length - 1 else [*picked, length - 1]


def tokenize(spec: dict) -> dict:
    import needlepoint

    tokenizer = needlepoint.open_checkpoint(spec["gguf"]).tokenizer
    return {"ids": {name: list(map(int, tokenizer.encode(text)))
                    for name, text in spec["texts"].items()}}


def _loaded(spec: dict, all_logits: bool = False):
    t0 = time.perf_counter()
    engine = make(spec, all_logits)
    t1 = time.perf_counter()
    engine.prefill(spec["ids"][:1])
    return engine, t1 - t0, time.perf_counter() - t1


def load(spec: dict) -> dict:
    engine, load_s, first = _loaded(spec)
    return {"load_s": load_s, "first_token_s": first, "vmhwm_mb": peak_rss_mb(),
            "version": engine.version, "variant": getattr(engine, "variant", None)}


def speed(spec: dict) -> dict:
    engine, load_s, first = _loaded(spec)
    return {"load_s": load_s, "first_token_s": first, **timed(engine, spec),
            "vmhwm_mb": peak_rss_mb(), "version": engine.version,
            "variant": getattr(engine, "variant", None)}


def fidelity(spec: dict) -> dict:
    engine = make(spec, all_logits=True)
    saved = {}
    for name, ids in spec["prompts"].items():
        logits = np.asarray(engine.logits(ids), np.float32)
        saved[name] = logits[rows(len(ids))]
    np.savez(spec["logits_path"], **saved)
    return {"prompts": {name: list(a.shape) for name, a in saved.items()}}


def compare(ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict:
    """max and mean |logit difference| and top-1 agreement over the saved rows of every
    prompt the two have in common, overall and per prompt."""
    per_prompt, diffs, agree = {}, [], []
    for name in sorted(set(ours) & set(reference)):
        a = np.asarray(ours[name], np.float64)
        b = np.asarray(reference[name], np.float64)
        diff = np.abs(a - b)
        same = a.argmax(-1) == b.argmax(-1)
        per_prompt[name] = {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                            "top1_agreement": float(same.mean()), "positions": int(a.shape[0])}
        diffs.append(diff.mean(-1))
        agree.append(same)
    if not per_prompt:
        return {"positions": 0, "per_prompt": {}}
    return {"max_abs_diff": max(p["max_abs_diff"] for p in per_prompt.values()),
            "mean_abs_diff": float(np.concatenate(diffs).mean()),
            "top1_agreement": float(np.concatenate(agree).mean()),
            "positions": int(sum(p["positions"] for p in per_prompt.values())),
            "per_prompt": per_prompt}


def compare_job(spec: dict) -> dict:
    out = {}
    for label, (ours, reference) in spec["pairs"].items():
        with np.load(ours) as a, np.load(reference) as b:
            out[label] = compare(dict(a), dict(b))
    return {"compare": out}


def peer_info(spec: dict) -> dict:
    """llama.cpp's version and the CPU features its build uses (`llama_print_system_info`)."""
    import llama_cpp

    return {"version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode().strip()}


JOBS = {"peer_info": peer_info, "tokenize": tokenize, "load": load, "speed": speed,
        "fidelity": fidelity, "compare": compare_job}


def main(argv: list[str]) -> int:
    return run_job(argv, JOBS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
