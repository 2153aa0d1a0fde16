"""Choosing the next token from a logit vector: greedy, or temperature with top-k / top-p.

Seeded sampling is reproducible *per position*: the random draw for the token at absolute
sequence position p comes from an RNG keyed by (seed, p) and nothing else, never from a
stream shared across steps. So the same seed gives the same tokens however the work is split
(batch, speculative draft, prefill chunking, a resumed session): a position's draw does not
depend on how many draws came before it.
"""

from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidOptionError

SEED_BITS = 63  # a drawn seed: a non-negative int64
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1  # seeds are int64, as OpenAI takes them
_UINT64 = (1 << 64) - 1


def _number(name: str, value: Any, rule: str) -> float:
    """`value` as a finite float, or InvalidOptionError naming the option and its rule."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidOptionError(f"{name} must be {rule}, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidOptionError(f"{name} must be {rule}, got {value!r}")
    return value


def check_seed(seed: Any) -> int | None:
    """The one seed rule of the API, the CLI and the server: None, or an int64
    ([-2**63, 2**63), what OpenAI accepts). Distinct seeds give distinct random streams."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise InvalidOptionError(f"seed must be an integer in [-2**63, 2**63), got {seed!r}")
    seed = int(seed)
    if not SEED_MIN <= seed <= SEED_MAX:
        raise InvalidOptionError(f"seed must be an integer in [-2**63, 2**63), got {seed}")
    return seed


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick tokens. `temperature <= 0` means greedy (top_k/top_p/seed are ignored).

    `top_k` 0 or None keeps every token; `top_p` 1.0 keeps the whole nucleus. `seed` None
    draws a fresh seed per generation (see `resolve_seed`)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        # Every check names the option and what it allows (InvalidOptionError, a ValueError).
        rule = "a finite number >= 0 (0 = greedy)"
        if _number("temperature", self.temperature, rule) < 0:
            raise InvalidOptionError(f"temperature must be {rule}, got {self.temperature!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(
                self.top_k, numbers.Integral) or self.top_k < 0):
            raise InvalidOptionError(f"top_k must be an integer >= 0 (0 or None: no limit), "
                                     f"got {self.top_k!r}")
        rule = "a number in (0, 1]"
        if not 0.0 < _number("top_p", self.top_p, rule) <= 1.0:
            raise InvalidOptionError(f"top_p must be {rule}, got {self.top_p!r}")
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def resolve_seed(seed: int | None) -> int:
    """The seed a generation uses: the given one, or a fresh random one when None."""
    return secrets.randbits(SEED_BITS) if seed is None else int(seed)


def position_rng(seed: int, position: int) -> np.random.Generator:
    """The RNG for the token at absolute `position`: a counter-based Philox keyed by
    (seed, position), so the draw is a pure function of the two (seed 003's rule)."""
    # The key is built as uint64 explicitly: a negative int64 seed maps to its two's
    # complement (a bijection), never through a float that would merge nearby seeds.
    key = np.array([int(seed) & _UINT64, int(position) & _UINT64], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key))


def apply_mask(logits: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """A float64 copy of `logits` with every disallowed token at -inf. `allowed` may be
    shorter than `logits` (a grammar over the tokenizer vocabulary when the LM head has more
    rows): the extra rows are disallowed."""
    out = np.asarray(logits, dtype=np.float64).copy()
    if allowed is None:
        return out
    allowed = np.asarray(allowed, dtype=bool)
    keep = np.zeros(out.shape[0], dtype=bool)
    n = min(out.shape[0], allowed.shape[0])
    keep[:n] = allowed[:n]
    if not keep.any():
        raise ValueError("the constraint allows no token at this step")
    out[~keep] = -np.inf
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of a logit vector (float64; -inf rows get probability 0)."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x)
    e = np.exp(x - top)
    return e / e.sum()


def sampling_probs(logits: np.ndarray, config: SamplingConfig) -> np.ndarray:
    """The distribution a sampled token is drawn from: softmax(logits / T) restricted to the
    top-k tokens, then to the smallest set whose mass reaches top_p, renormalised."""
    probs = softmax(np.asarray(logits, dtype=np.float64) / config.temperature)
    k = config.top_k
    if k and k < probs.shape[0]:
        # Stable sort by descending probability so ties keep the lower id (deterministic).
        order = np.argsort(-probs, kind="stable")
        probs[order[k:]] = 0.0
    if config.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep every token whose preceding mass is still below top_p (the first always).
        cut = np.searchsorted(cumulative, config.top_p * cumulative[-1], side="left") + 1
        probs[order[cut:]] = 0.0
    return probs / probs.sum()


def choose_token(
    logits: np.ndarray,
    config: SamplingConfig,
    *,
    position: int,
    seed: int,
    allowed: np.ndarray | None = None,
) -> int:
    """Pick the token for absolute `position`: argmax (first index on ties) when greedy, else
    one inverse-CDF draw from `position_rng(seed, position)` over `sampling_probs`."""
    masked = apply_mask(logits, allowed)
    if config.greedy:
        return int(np.argmax(masked))
    probs = sampling_probs(masked, config)
    u = position_rng(seed, position).random()
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    # Guard against float round-off at the top end landing on a zero-probability tail.
    index = min(index, probs.shape[0] - 1)
    while probs[index] == 0.0:
        index -= 1
    return index
