"""The published confidence of an answer and of each of its calls, from the decisions the model
made (`generation/decisions.py`), for every model without a confidence head.

    evidence(answer) = product of the probabilities of every decision in the answer
    evidence(call k) = product of the probabilities of call k's own decisions
    published        = CALIBRATION(evidence)

A decision's probability is the lowest `q` of its chosen tokens, `q` being the chosen token's
probability among the tokens the grammar allowed there (forced tokens carry none). The
product is the chance that every decision is right if each one's `q` is its chance of being
right and they are independent; it does not fall with the number of tokens (a forced key,
separator or marker adds nothing, and a confident value's extra tokens leave its minimum),
only with the number of real choices. An answer or call whose every token was forced (a
named tool without arguments) has evidence 1; an answer in which the model decided nothing
(a text-only turn, `tool_choice="none"`) has None.

`CALIBRATION` maps the raw evidence to the published number; it is the one place its
parameters live (fitted on BFCL's `live_*` categories: `fit_calibration`). `Calibration()` is
the identity; raw 0 and 1 map to themselves (the map's limits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EPS = 1e-12


@dataclass(frozen=True)
class Calibration:
    """`sigmoid(slope * logit(raw) + offset)` (Platt scaling on the log-odds of the raw
    evidence): the identity at slope 1, offset 0."""

    slope: float = 1.0
    offset: float = 0.0

    def __call__(self, raw: float | None) -> float | None:
        if raw is None:
            return None
        if (self.slope == 1.0 and self.offset == 0.0) or raw <= 0.0 or raw >= 1.0:
            # 0 and 1 are the map's own limits (slope > 0): certain evidence (every token
            # forced) stays 1, impossible stays 0
            return float(min(max(raw, 0.0), 1.0))
        p = min(max(float(raw), EPS), 1.0 - EPS)
        z = self.slope * math.log(p / (1.0 - p)) + self.offset
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


# The published confidence's calibration, fitted (`fit_calibration`) on 314 answers of the real
# Qwen2.5-Coder-0.5B-Instruct GGUF through `needlepoint serve` on BFCL's live_* categories only
# (forced and auto; bench/needlepoint_bench/bfcl_calibration.py, docs/benchmarks_bfcl.md): the
# raw evidence's log-odds are shrunk to 0.349 of themselves (a product of decisions' `q` is
# overconfident near 1 and underconfident near 0). 10-bin ECE on live 0.146 -> 0.101, on the
# held-out categories 0.204 -> 0.165; monotone, so the ranking (AUROC) is unchanged.
CALIBRATION = Calibration(slope=0.349, offset=-0.0935)


def _prob(decision: Any) -> float:
    return float(decision["prob"] if isinstance(decision, dict) else decision.prob)


def _call(decision: Any) -> int | None:
    return decision["call"] if isinstance(decision, dict) else decision.call


def answer_evidence(decisions: Sequence[Any], calls: int) -> float | None:
    """The raw evidence of an answer with `calls` calls (module doc)."""
    if not decisions:
        return 1.0 if calls else None
    return math.prod(_prob(d) for d in decisions)


def call_evidence(decisions: Sequence[Any], calls: int) -> list[float]:
    """The raw evidence of each of the answer's `calls` calls, in order."""
    return [math.prod(_prob(d) for d in decisions if _call(d) == k) for k in range(calls)]


def published(raw: float | None, calibration: Calibration = CALIBRATION) -> float | None:
    """The published confidence of raw evidence (`CALIBRATION`)."""
    return calibration(raw)


def fit_calibration(raw: Sequence[float], right: Sequence[bool], steps: int = 2000,
                    rate: float = 0.1) -> Calibration:
    """Platt scaling: the `Calibration` that maximises the likelihood of `right` (whether each
    answer was right) given its raw evidence, by gradient descent on the log loss."""
    xs = [math.log(min(max(r, EPS), 1 - EPS) / (1 - min(max(r, EPS), 1 - EPS))) for r in raw]
    ys = [1.0 if y else 0.0 for y in right]
    if not xs:
        return Calibration()
    a, b = 1.0, 0.0
    for _ in range(steps):
        ga = gb = 0.0
        for x, y in zip(xs, ys, strict=True):
            z = a * x + b
            p = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
            ga += (p - y) * x
            gb += p - y
        a -= rate * ga / len(xs)
        b -= rate * gb / len(xs)
    return Calibration(a, b)


__all__ = ["CALIBRATION", "Calibration", "answer_evidence", "call_evidence", "fit_calibration",
           "published"]
