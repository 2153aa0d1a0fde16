"""Shared helpers of the stage tests (`tests/stages/`): prompts, the single-process
references they are compared with, and the comparisons. Every expected value is computed by
the single-process model (`needlepoint.load(path)`), never recorded from a staged run."""

from __future__ import annotations

import itertools

import numpy as np
from conftest import get_fixture

F32 = np.float32


def fixture_path(name: str):
    return get_fixture("needle3", name).cact


def long_prompt(name: str, count: int) -> np.ndarray:
    """`count` token ids: the fixture's prompts concatenated (repeated as needed)."""
    arrays = get_fixture("needle3", name).arrays
    parts = [arrays[k] for k in sorted(arrays.files) if k.endswith("_tokens")]
    ids = np.concatenate(parts)
    while len(ids) < count:
        ids = np.concatenate([ids, ids])
    return ids[:count].astype(np.int64)


def all_cut_sets(layers: int) -> list[list[int]]:
    """Every way to cut `layers` blocks into contiguous stages (2^(layers-1) of them)."""
    inner = range(1, layers)
    return [[0, *combo] for k in range(layers) for combo in itertools.combinations(inner, k)]


def stepped(session, ids: np.ndarray, first: int = 1) -> np.ndarray:
    """Logits after each of `ids`: a prefill of the first `first`, then one step each."""
    rows = [session.prefill(ids[:first])] if first == 1 else list(session.extend(ids[:first]))
    rows += [session.step(int(token)) for token in ids[first:]]
    return np.stack(rows)


def assert_bits(actual: np.ndarray, expected: np.ndarray, what: str = "logits") -> None:
    """Bit-identical (`np.array_equal`), with where they first differ when they do not."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if not np.array_equal(actual, expected):
        bad = np.argwhere(actual != expected)
        delta = float(np.max(np.abs(actual.astype(np.float64) - expected)))
        raise AssertionError(f"{what}: {len(bad)} values differ (first at {bad[0].tolist()}, "
                             f"max |delta| {delta:.3g})")


def assert_confidence(actual: float | None, expected: float | None) -> None:
    """The confidence logit pools in float32 with BLAS products (docs/numerics.md): it agrees
    across chunkings to float rounding, so to 1e-5 (relative) here."""
    assert (actual is None) == (expected is None)
    if expected is not None:
        assert np.isclose(actual, expected, rtol=1e-5, atol=1e-6), (actual, expected)
