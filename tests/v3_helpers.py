"""Shared helpers for the Needle 3 tests: one model per (fixture, numerics, layers), loaded once."""

from __future__ import annotations

import numpy as np
from conftest import get_fixture

import needlepoint

GREEDY_MARGIN = {"float": 1e-2, "deploy": 0.5}
_MODELS: dict = {}


def model(name: str, numerics: str = "deploy", layers: int | None = None):
    key = (name, numerics, layers)
    if key not in _MODELS:
        _MODELS[key] = needlepoint.load(
            get_fixture("needle3", name).cact, numerics=numerics, layers=layers
        )
    return _MODELS[key]


def prompt_count(name: str) -> int:
    return len(get_fixture("needle3", name).meta["prompts"])


def trusted_steps(margins: np.ndarray, threshold: float) -> int:
    """Greedy steps before the first one whose recorded top-1/top-2 margin is <= threshold."""
    fragile = np.nonzero(np.asarray(margins) <= threshold)[0]
    return int(fragile[0]) if len(fragile) else len(margins)


def greedy(session, prompt: np.ndarray, steps: int = 32) -> np.ndarray:
    logits = session.prefill(prompt)
    out = []
    for _ in range(steps):
        token = int(np.argmax(logits))
        out.append(token)
        logits = session.step(token)
    return np.asarray(out)


def oracle_row(name: str, mode: str, index: int) -> dict:
    rows = get_fixture("needle3", name).meta["oracle_self_consistency"][mode]
    return next(row for row in rows if row["prompt"] == index)


def rms(delta: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(delta, dtype=np.float64))))


def assert_within_deploy_floor(name: str, logits: np.ndarray, reference: np.ndarray) -> None:
    """The statistical bound every deploy comparison uses (fixture README "How strictly to
    compare"): over all rows, rms <= 2x the oracle's worst self-consistency rms on this
    fixture + 0.01, and argmax agreement >= the oracle's worst agreement - 0.05."""
    consistency = get_fixture("needle3", name).meta["oracle_self_consistency"]["deploy"]
    worst_rms = max(row["rms"] for row in consistency)
    worst_agreement = min(row["argmax_agree"] for row in consistency)
    assert rms(logits - reference) <= 2 * worst_rms + 0.01
    agreement = np.mean(logits.argmax(-1) == reference.argmax(-1))
    assert agreement >= worst_agreement - 0.05
