"""How long a draft is worth verifying: acceptance rates and the cost of a pass.

A draft token at position i of a draft is used only if every token before it was accepted,
so its chance of paying off is the product r_i of the acceptance rates of the tokens up to
it. Verifying it costs `slope` (the time one more position adds to a pass); it saves a
whole step (`step`) when accepted. So a draft is cut at the first token where
`r_i < slope / step` (`DraftPolicy.keep`): on a small model whose pass is mostly fixed
overhead (the toy: one more position costs ~5% of a step) long drafts are cheap; at the
shipped geometry (~35%) only tokens that are nearly sure (grammar fast-forward, long
n-gram matches that keep being accepted) are worth a position.

In a batch (the scheduler's engine steps, `api/scheduler.py`) a pass's wall time is the
whole step of every session, so the slope a turn measures is near zero and every draft looks
free, while each draft row costs the step what any row costs. There a draft token is worth
a row when its expected yield beats what a row yields: with a step of R rows taking S seconds
(rows cost nearly alike: a batched step is its products) that bring B decoding sessions one
token each, a row costs about S / R and yields B / S tokens a second, so the cut is
`r_i < B / R` (`batched`, reported by the scheduler after each step; steps of one session keep
the timed slope / step).

Acceptance rates are counted per kind of draft token (`Draft.kinds`: grammar, opening,
lookup by n-gram length and first/continuing token), starting from priors; the step and
slope are running averages of this model's own passes. Both are kept per model
(`policy_for`), so a process learns them over its turns. They only decide how much is
drafted: the tokens produced never depend on them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

# prior (acceptance rate given the token is reached, weight in tokens) per kind prefix
PRIORS = {"grammar": (0.97, 8.0), "opening": (0.8, 4.0), "lookup+": (0.6, 4.0),
          "lookup": (0.3, 4.0)}
DEFAULT_RATIO = 0.1  # slope / step before this model has been timed
RATIO_RANGE = (0.01, 0.9)
EMA = 0.2  # weight of a new timing


class DraftPolicy:
    """Acceptance counts per kind and the running cost of passes, for one model."""

    def __init__(self, ratio: float | None = None) -> None:
        self.counts: dict[str, list[float]] = {}  # kind -> [accepted, reached]
        self.step: float | None = None  # seconds of a one-position pass
        self.slope: float | None = None  # seconds per extra position
        self.fixed_ratio = ratio
        self.batch: float | None = None  # running B / R of batched steps (None: not batched)
        self._lock = threading.Lock()

    def rate(self, kind: str) -> float:
        prior, weight = _prior(kind)
        accepted, reached = self.counts.get(kind, (0.0, 0.0))
        return (accepted + prior * weight) / (reached + weight)

    def ratio(self) -> float:
        """slope / step: the cost of one more verified position, in steps."""
        if self.fixed_ratio is not None:
            return self.fixed_ratio
        low, high = RATIO_RANGE
        if self.batch is not None:
            return min(high, max(low, self.batch))
        if not self.step or self.slope is None:
            return DEFAULT_RATIO
        return min(high, max(low, self.slope / self.step))

    def keep(self, kinds: Sequence[str]) -> int:
        """How many of a draft's tokens (by kind) are worth verifying."""
        threshold = self.ratio()
        reach = 1.0
        for i, kind in enumerate(kinds):
            reach *= self.rate(kind)
            if reach < threshold:
                return i
        return len(kinds)

    def worth_pass(self, kinds: Sequence[str]) -> bool:
        """Whether draft tokens are worth a pass of their own: the steps they are expected to
        save (the sum of their reach) beat what the pass costs in steps."""
        ratio = self.ratio()
        reach, saved = 1.0, 0.0
        for kind in kinds:
            reach *= self.rate(kind)
            saved += reach
        return saved > 1 - ratio + ratio * len(kinds)

    def reached(self, kind: str, accepted: bool) -> None:
        with self._lock:
            counts = self.counts.setdefault(kind, [0.0, 0.0])
            counts[0] += accepted
            counts[1] += 1

    def batched(self, sessions: int, rows: int) -> None:
        """An engine step ran `rows` rows that brought `sessions` decoding sessions a token
        each (module doc); a step of one session returns the policy to its timings."""
        with self._lock:
            if sessions < 2 or rows < sessions:
                if sessions == 1:
                    self.batch = None
                return
            share = sessions / rows
            self.batch = share if self.batch is None else (1 - EMA) * self.batch + EMA * share

    def timed(self, positions: int, seconds: float) -> None:
        """A pass of `positions` rows took `seconds`."""
        with self._lock:
            if positions == 1:
                self.step = seconds if self.step is None else (
                    (1 - EMA) * self.step + EMA * seconds)
            elif self.step is not None and positions >= 3:
                slope = max(0.0, (seconds - self.step) / (positions - 1))
                self.slope = slope if self.slope is None else (
                    (1 - EMA) * self.slope + EMA * slope)


def _prior(kind: str) -> tuple[float, float]:
    if kind.startswith("lookup"):
        return PRIORS["lookup+" if kind.endswith("+") else "lookup"]
    return PRIORS.get(kind, (0.5, 4.0))


_POLICIES: weakref.WeakKeyDictionary[Any, DraftPolicy] = weakref.WeakKeyDictionary()
_POLICIES_LOCK = threading.Lock()


def policy_for(model: Any) -> DraftPolicy:
    """The policy shared by every turn decoded on `model` (a fresh one for None or a model
    that cannot be weakly referenced). The caller names the model (`api/conversation.py`):
    a session does not have to know its model."""
    if model is None:
        return DraftPolicy()
    with _POLICIES_LOCK:
        try:
            policy = _POLICIES.get(model)
            if policy is None:
                policy = _POLICIES[model] = DraftPolicy()
        except TypeError:  # not weakly referenceable
            return DraftPolicy()
    return policy


def share_policy(view: Any, model: Any) -> None:
    """Turns decoded on `view` (a scheduler lease's view of `model`, `api/batched.py`) learn
    into `model`'s policy, for as long as the view lives."""
    policy = policy_for(model)
    with _POLICIES_LOCK:
        _POLICIES[view] = policy
