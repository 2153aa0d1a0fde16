"""Needle 3 decode sessions: cached prefill + step against the fixtures' greedy and `_kvwin`
references, prefill/step agreement, multi-turn prefill, fork, confidence head, input errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NEEDLE3_FIXTURES, get_fixture
from v3_helpers import (
    GREEDY_MARGIN,
    assert_within_deploy_floor,
    greedy,
    model,
    prompt_count,
    rms,
    trusted_steps,
)

from needlepoint.errors import ModelInputError

CASES = [(name, i) for name in NEEDLE3_FIXTURES for i in range(prompt_count(name))]
MODES = ("float", "deploy")
KVWIN_CASES = [
    (name, i)
    for name, i in CASES
    if f"p{i}_greedy_float_kvwin" in get_fixture("needle3", name).arrays
]
# Upstream confidence logits: float cells are exact to ~1e-5; deploy cells carry A8 flips.
CONF_TOL = {"float": 1e-4, "deploy": 0.1}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,index", CASES)
def test_greedy(name, index, mode):
    arrays = get_fixture("needle3", name).arrays
    tokens = greedy(model(name, mode).session(), arrays[f"p{index}_tokens"])
    ref = arrays[f"p{index}_greedy_{mode}"]
    trusted = trusted_steps(arrays[f"p{index}_greedy_{mode}_margin"], GREEDY_MARGIN[mode])
    np.testing.assert_array_equal(tokens[:trusted], ref[:trusted])


@pytest.mark.parametrize("name,index", CASES)
def test_deploy_step_logits(name, index):
    """The logits that chose the first 8 deploy greedy tokens (teacher-forced continuation)."""
    arrays = get_fixture("needle3", name).arrays
    ref = arrays[f"p{index}_greedy_deploy_logits"]
    session = model(name, "deploy").session()
    rows = [session.prefill(arrays[f"p{index}_tokens"])]
    rows += [session.step(int(t)) for t in arrays[f"p{index}_greedy_deploy"][: len(ref) - 1]]
    worst = max(r["rms"] for r in get_fixture("needle3", name).meta[
        "oracle_self_consistency"]["deploy"])
    assert rms(np.stack(rows) - ref) <= 2 * worst + 0.01


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,index", KVWIN_CASES)
def test_kv_window(name, index, mode):
    """kv_window-bounded rings (wrapping past the window) match the `_kvwin` references."""
    arrays = get_fixture("needle3", name).arrays
    net = model(name, mode)
    window = net.config.kv_window
    prompt = arrays[f"p{index}_tokens"]
    session = net.session(kv_window=window)
    tokens = greedy(session, prompt)
    assert session.position == len(prompt) + 32 > window
    ref = arrays[f"p{index}_greedy_{mode}_kvwin"]
    trusted = trusted_steps(arrays[f"p{index}_greedy_{mode}_kvwin_margin"], GREEDY_MARGIN[mode])
    np.testing.assert_array_equal(tokens[:trusted], ref[:trusted])
    if mode == "deploy":
        # every prompt position through the ring, a step at a time past the window
        stepped = net.session(kv_window=window)
        half = min(len(prompt), window) // 2
        rows = [stepped.prefill(prompt[:half])]
        rows += [stepped.step(int(t)) for t in prompt[half:]]
        logits = np.stack(rows)
        ref_logits = arrays[f"p{index}_logits_deploy_kvwin"][half - 1 :]
        assert_within_deploy_floor(name, logits, ref_logits)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,index", CASES)
def test_prefill_then_step_equals_stepping(name, index, mode):
    """Batched prefill (128-position chunks) against stepping every token (one-token decode
    path), at every prompt position and 8 decode steps beyond.

    Deploy numerics are batch-invariant (docs/numerics.md): the same bits whatever the chunk,
    so the two paths must agree exactly. Float numerics multiply in a different float32
    summation order (BLAS gemm over a chunk vs a streamed one-row product): the logits agree
    to 2e-5 of their range (measured <= 1.0e-5)."""
    arrays = get_fixture("needle3", name).arrays
    net = model(name, mode)
    prompt = arrays[f"p{index}_tokens"]
    batched_rows = net.forward(prompt)
    stepped = net.session()
    stepped_rows = [stepped.step(int(token)) for token in prompt]
    batched = net.session()
    batched.prefill(prompt, logits=False)
    assert batched.position == stepped.position == len(prompt)
    continuation = arrays[f"p{index}_greedy_{mode}"][:8]
    batched_rows = np.concatenate(
        [batched_rows, np.stack([batched.step(int(t)) for t in continuation])])
    stepped_rows += [stepped.step(int(t)) for t in continuation]
    stepped_rows = np.stack(stepped_rows)
    if mode == "float":
        scale = max(1.0, float(np.abs(batched_rows).max()))
        assert np.abs(batched_rows - stepped_rows).max() <= 2e-5 * scale
    else:
        np.testing.assert_array_equal(stepped_rows, batched_rows)


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_multi_turn_and_fork(name):
    arrays = get_fixture("needle3", name).arrays
    net = model(name, "float")
    prompt = arrays[f"p{prompt_count(name) - 1}_tokens"]
    split = len(prompt) // 2
    whole = net.session()
    ref = whole.prefill(prompt)
    turns = net.session()
    assert turns.prefill(prompt[:split], logits=False) is None
    fork = turns.fork()
    got = turns.prefill(prompt[split:])
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(got - ref).max() <= 2e-5 * scale
    assert np.abs(fork.prefill(prompt[split:]) - got).max() == 0.0  # forks are independent
    assert fork.position == turns.position == len(prompt)
    np.testing.assert_allclose(
        got, arrays[f"p{prompt_count(name) - 1}_logits_float"][-1], atol=2e-3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,index", CASES)
def test_confidence(name, index, mode):
    arrays = get_fixture("needle3", name).arrays
    net = model(name, mode)
    prompt = arrays[f"p{index}_tokens"]
    tol = CONF_TOL[mode]
    assert abs(net.confidence_logit(prompt) - arrays[f"p{index}_conf_logit_{mode}"]) <= tol
    session = net.session()
    session.prefill(prompt, logits=False)
    assert abs(session.confidence_logit() - arrays[f"p{index}_conf_logit_{mode}"]) <= tol
    for token in arrays[f"p{index}_greedy_{mode}"]:
        session.prefill([int(token)], logits=False)
    ref = arrays[f"p{index}_with_greedy_conf_logit_{mode}"]
    assert abs(session.confidence_logit() - ref) <= tol


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_session_trace(name):
    arrays = get_fixture("needle3", name).arrays
    seen: dict[str, np.ndarray] = {}
    session = model(name, "float").session(trace=lambda key, value: seen.__setitem__(key, value))
    prompt = arrays["p0_tokens"]
    logits = session.prefill(prompt)
    assert set(seen) >= {"tokens", "emb_row", "emb_row_scaled", "engram_idx", "engram_k",
                         "engram_v", "cells", "final_hidden", "logits"}
    np.testing.assert_allclose(seen["cells"], arrays["p0_cells_float"], atol=2e-3)
    np.testing.assert_array_equal(seen["logits"][-1], logits)
    session.step(int(np.argmax(logits)))
    assert seen["cells"].shape[0] == 1 and seen["engram_k"].shape[1] == 1


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_input_errors(name):
    net = model(name, "float")
    cfg = net.config
    with pytest.raises(ModelInputError, match="out of range"):
        net.forward([2, cfg.vocab])
    with pytest.raises(ModelInputError, match="out of range"):
        net.session().prefill([-1])
    with pytest.raises(ModelInputError, match="empty"):
        net.forward([])
    with pytest.raises(ModelInputError, match="max_seq_len"):
        net.forward(np.full(cfg.max_seq_len + 1, 2))
    session = net.session()
    session.prefill(np.full(cfg.max_seq_len - 1, 2), logits=False) if name == "tiny" else None
    if name == "tiny":
        session.step(2)
        with pytest.raises(ModelInputError, match="max_seq_len"):
            session.step(2)
    with pytest.raises(ModelInputError, match="out of range"):
        net.session().step(cfg.vocab + 5)
