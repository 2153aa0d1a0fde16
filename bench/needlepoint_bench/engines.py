"""Adapters giving both engines one timing interface.

Every method returns wall seconds (`time.perf_counter`) and process CPU seconds
(`time.process_time`, all threads) around exactly the work named, plus what is needed to
check that both engines saw the same ids.

needle-rs (`needle_rs.V3Engine`, 0.3.1) exposes no logits and no raw-id entry point: the
only generation call is `generate(query, tools_json, max_new_tokens, temperature, seed,
system, constrain, kv_int8)`, which renders, tokenizes, prefills and decodes. So
* prefill = one `generate(..., max_new_tokens=1)` call: render + tokenize + prefill + one
  argmax (the first token comes from the prefill logits; timing shows no extra step);
* decode  = `generate(max_new_tokens=n+1)` minus `generate(max_new_tokens=1)` on the same
  prompt, measured back to back: n steps. Per-call fixed costs cancel.
needlepoint is driven the same way: prefill = `session()` + `prefill(ids)` + argmax; decode =
n x (argmax + `step`) after a prefill, timed around the steps only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .prompts import Prompt

NEEDLE_RS = "needle-rs"
NP_DEPLOY = "needlepoint-deploy"
NP_FLOAT = "needlepoint-float"
ALL_ENGINES = (NEEDLE_RS, NP_DEPLOY, NP_FLOAT)
# Load and RSS samples of a needlepoint engine with its weight cache present (warm) are kept
# under the engine's name + this suffix; the plain name is the cold load (no cache file yet).
CACHED = "+cache"


def cached(name: str) -> str:
    return name + CACHED


class Clock:
    """Wall time and process CPU time (all threads) since construction.

    On a shared machine wall time includes waiting for a core; for a single-threaded run CPU
    time does not, so both are kept."""

    def __init__(self) -> None:
        self.w0, self.c0 = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.w0, time.process_time() - self.c0


class Unavailable(Exception):
    """The engine cannot run here (import error, missing attribute, ...)."""


class NeedleRsEngine:
    name = NEEDLE_RS

    def __init__(self, archive: Path) -> None:
        self.archive = str(archive)
        self.engine: Any = None

    def load(self) -> float:
        try:
            import needle_rs
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
        t0 = time.perf_counter()
        self.engine = needle_rs.V3Engine.load(self.archive)
        return time.perf_counter() - t0

    def _generate(self, p: Prompt, n: int) -> tuple[float, float, dict]:
        clock = Clock()
        out = self.engine.generate(
            p.query, p.tools_json, max_new_tokens=n, temperature=0.0, system=p.system
        )
        return *clock.read(), out

    def prefill(self, p: Prompt) -> dict:
        dt, cpu, out = self._generate(p, 1)
        ids = list(out["token_ids"])
        return {
            "seconds": dt,
            "cpu_seconds": cpu,
            "first_token": ids[0] if ids else None,
            "prompt_tokens": int(out["positions"]) - len(ids),
        }

    def decode(self, p: Prompt, n: int) -> dict:
        t1, c1, _ = self._generate(p, 1)
        tn, cn, out = self._generate(p, n + 1)
        ids = list(out["token_ids"])
        return {
            "seconds": tn - t1,
            "cpu_seconds": cn - c1,
            "steps": max(len(ids) - 1, 0),
            "tokens": ids,
            "stop_reason": str(out["stop_reason"]),
            "prompt_tokens": int(out["positions"]) - len(ids),
        }

    def generate(self, p: Prompt, n: int) -> dict:
        dt, _, out = self._generate(p, n + 1)
        return {"seconds": dt, "tokens": len(out["token_ids"])}

    def describe(self) -> dict:
        return {"num_layers": self.engine.num_layers, "max_seq_len": self.engine.max_seq_len}


class NeedlepointEngine:
    def __init__(self, archive: Path, numerics: str) -> None:
        self.archive = str(archive)
        self.numerics = numerics
        self.name = f"needlepoint-{numerics}"
        self.model: Any = None

    def load(self) -> float:
        try:
            if os.environ.get("NEEDLEPOINT_BENCH_FAKE_UNAVAILABLE"):  # exercises this path
                raise ImportError(os.environ["NEEDLEPOINT_BENCH_FAKE_UNAVAILABLE"])
            import needlepoint
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"import needlepoint: {type(exc).__name__}: {exc}") from exc
        t0 = time.perf_counter()
        try:
            model = needlepoint.load(self.archive, numerics=self.numerics)
            for attr in ("session",):
                if not hasattr(model, attr):
                    raise AttributeError(f"{type(model).__name__} has no attribute {attr!r}")
        except Exception as exc:  # noqa: BLE001
            raise Unavailable(f"needlepoint.load: {type(exc).__name__}: {exc}") from exc
        dt = time.perf_counter() - t0
        self.model = model
        return dt

    def prefill(self, p: Prompt) -> dict:
        ids = list(p.ids)
        clock = Clock()
        s = self.model.session()
        logits = s.prefill(ids)
        tok = int(np.argmax(logits))
        dt, cpu = clock.read()
        return {"seconds": dt, "cpu_seconds": cpu, "first_token": tok, "prompt_tokens": len(ids)}

    def decode(self, p: Prompt, n: int) -> dict:
        s = self.model.session()
        logits = s.prefill(list(p.ids))
        tokens = [int(np.argmax(logits))]
        clock = Clock()
        for _ in range(n):
            logits = s.step(tokens[-1])
            tokens.append(int(np.argmax(logits)))
        dt, cpu = clock.read()
        return {
            "seconds": dt,
            "cpu_seconds": cpu,
            "steps": n,
            "tokens": tokens,
            "stop_reason": "none (no EOS stop)",
            "prompt_tokens": len(p.ids),
        }

    def decode_profile(self, p: Prompt, n: int = 16, top: int = 8) -> dict:
        """cProfile over `n` decode steps after prefilling `p`: interpreter calls per token
        (Python functions and C builtins, as cProfile counts them) and the functions with
        the most own time per token."""
        import cProfile  # noqa: PLC0415
        import pstats  # noqa: PLC0415

        s = self.model.session()
        tok = int(np.argmax(s.prefill(list(p.ids))))
        tok = int(np.argmax(s.step(tok)))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            tok = int(np.argmax(s.step(tok)))
        profiler.disable()
        stats = pstats.Stats(profiler)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
        return {
            "steps": n,
            "calls_per_token": stats.total_calls / n,
            "top": [{"function": f"{Path(f).name}:{line}({name})", "calls_per_token": nc / n,
                     "own_ms_per_token": 1000 * tt / n}
                    for (f, line, name), (_, nc, tt, _, _) in rows],
        }

    def generate(self, p: Prompt, n: int) -> dict:
        t0 = time.perf_counter()
        s = self.model.session()
        logits = s.prefill(list(p.ids))
        tok = int(np.argmax(logits))
        for _ in range(n):
            tok = int(np.argmax(s.step(tok)))
        return {"seconds": time.perf_counter() - t0, "tokens": n + 1}

    def describe(self) -> dict:
        return {"class": type(self.model).__name__}


def make_engine(name: str, archive: Path):
    if name == NEEDLE_RS:
        return NeedleRsEngine(archive)
    if name == NP_DEPLOY:
        return NeedlepointEngine(archive, "deploy")
    if name == NP_FLOAT:
        return NeedlepointEngine(archive, "float")
    raise ValueError(f"unknown engine {name!r}; choose from {', '.join(ALL_ENGINES)}")
