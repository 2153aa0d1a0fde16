"""Deploy numerics are exact and batch-invariant (docs/numerics.md): the same logits, bit for bit
(`np.array_equal`), from `forward`, from `prefill` (any chunk size), from stepping every
token, at 1 and 2 BLAS threads, and from the native kernels and their numpy references, on
every needle3 fixture and the bundled toy model; and across ring wrap-around with a kv
window."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import NEEDLE3_FIXTURES, REPO_ROOT, get_fixture, toy_model_path
from threadpoolctl import threadpool_limits
from v3_helpers import model

import needlepoint
from needlepoint.kernels import native

# the longest prompt of each fixture crosses its sliding window and kv window
LONGEST = {"tiny": 3, "small": 3, "shipped": 1}


def _prompt(name: str) -> np.ndarray:
    return get_fixture("needle3", name).arrays[f"p{LONGEST[name]}_tokens"]


def _stepped(net, ids: np.ndarray, **session_options) -> np.ndarray:
    session = net.session(**session_options)
    rows = [session.prefill(ids[:1])]
    rows += [session.step(int(token)) for token in ids[1:]]
    return np.stack(rows)


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_forward_prefill_and_steps_are_bit_identical(name):
    net = model(name)
    ids = _prompt(name)[:96] if name == "shipped" else _prompt(name)
    full = net.forward(ids)
    np.testing.assert_array_equal(net.session().prefill(ids), full[-1])
    np.testing.assert_array_equal(_stepped(net, ids), full)


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("chunk", [1, 7, 16, 64, 200])
def test_every_chunk_size_gives_the_same_bits(name, chunk):
    net = model(name)
    ids = _prompt(name)
    expected = net.forward(ids)[-1]
    np.testing.assert_array_equal(net.session(chunk=chunk).prefill(ids), expected)


def test_mixed_prefill_and_steps_across_ring_wrap_around():
    """With the archive's kv window every layer is a ring; a 256-token prompt wraps tiny's
    48-slot rings several times. Prefill in odd chunks, then step: the same bits as stepping
    every token from the start."""
    net = model("tiny")
    ids = _prompt("tiny")
    window = net.config.kv_window
    assert len(ids) > 3 * window
    stepped = _stepped(net, ids, kv_window=window)
    session = net.session(kv_window=window, chunk=37)
    np.testing.assert_array_equal(session.prefill(ids[:150]), stepped[149])
    for position in range(150, len(ids)):
        np.testing.assert_array_equal(session.step(int(ids[position])), stepped[position])


def test_toy_model_is_bit_identical_across_paths():
    net = needlepoint.load(toy_model_path(), cache=False)
    tokenizer = net.tokenizer
    ids = np.asarray([tokenizer.bos_id] + tokenizer.encode("wake me up at 06:45 please"))
    full = net.forward(ids)
    np.testing.assert_array_equal(_stepped(net, ids), full)
    np.testing.assert_array_equal(net.session(chunk=5).prefill(ids), full[-1])


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_thread_count_does_not_change_the_bits(name):
    """`threads=2` splits the native products' rows between two threads; BLAS pools at 1 or
    2 threads: the same bits either way."""
    ids = _prompt(name)[:64]
    one = needlepoint.load(get_fixture("needle3", name).cact, threads=1).forward(ids)
    two_threads = needlepoint.load(get_fixture("needle3", name).cact, threads=2)
    assert two_threads.threads == 2
    np.testing.assert_array_equal(two_threads.forward(ids), one)
    with threadpool_limits(limits=2):
        np.testing.assert_array_equal(model(name).forward(ids), one)
    threadpool_limits(limits=1)


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_native_kernels_equal_the_numpy_reference(name, monkeypatch):
    assert native.LIBRARY is not None, native.UNAVAILABLE_REASON
    net = model(name)
    ids = _prompt(name)[: 24 if name == "shipped" else 80]
    with_native = net.forward(ids)
    monkeypatch.setattr(native, "LIBRARY", None)  # every kernel takes its numpy reference
    np.testing.assert_array_equal(net.forward(ids), with_native)


def test_other_machine_settings_give_the_same_bits(tmp_path):
    """A fresh process with the baseline (non-AVX2) native kernels and numpy's SIMD dispatch
    turned down gives the same logits bits as this one."""
    ids = _prompt("tiny")[:64]
    expected = model("tiny").forward(ids)
    out = tmp_path / "logits.npy"
    script = (
        "import numpy as np, needlepoint; "
        f"m = needlepoint.load({str(get_fixture('needle3', 'tiny').cact)!r}, cache=False); "
        f"np.save({str(out)!r}, m.forward(np.array({ids.tolist()})))"
    )
    env = dict(os.environ, NEEDLEPOINT_NATIVE_VARIANT="0",
               NPY_DISABLE_CPU_FEATURES="AVX512F AVX512CD AVX512_SKX AVX2 FMA3")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=REPO_ROOT,
                   timeout=120)
    np.testing.assert_array_equal(np.load(out), expected)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_batched_sessions_get_the_bits_they_get_alone(name):
    """`model.run_batch`: chunks of several sessions stacked into one pass (the products read
    the weights once); each session's logits equal the same work done alone, through prefill,
    mixed lengths, decode steps and an all-logits extend."""
    net = model(name)
    arrays = get_fixture("needle3", name).arrays
    prompts = [arrays[f"p{i}_tokens"] for i in (1, 2, 3, 4)]
    alone = []
    for ids in prompts:
        session = net.session(chunk=32)
        first = session.prefill(ids)
        steps = [session.step(int(t)) for t in (5, 9, 11)]
        alone.append((first, steps, session.extend([20, 21, 22])))
    sessions = [net.session(chunk=32) for _ in prompts]
    firsts = net.run_batch([(s, ids, False) for s, ids in zip(sessions, prompts, strict=True)])
    for (first, _, _), got in zip(alone, firsts, strict=True):
        np.testing.assert_array_equal(got, first)
    for step_index, token in enumerate((5, 9, 11)):
        got = net.run_batch([(s, [token], False) for s in sessions])
        for (_, steps, _), row in zip(alone, got, strict=True):
            np.testing.assert_array_equal(row, steps[step_index])
    got = net.run_batch([(s, [20, 21, 22], True) for s in sessions])
    for (_, _, extended), rows in zip(alone, got, strict=True):
        np.testing.assert_array_equal(rows, extended)


def test_extend_equals_stepping_one_by_one():
    net = model("tiny")
    ids = _prompt("tiny")
    stepped = _stepped(net, ids, kv_window=net.config.kv_window)
    session = net.session(kv_window=net.config.kv_window)
    session.prefill(ids[:100])
    np.testing.assert_array_equal(session.extend(ids[100:190]), stepped[100:190])
    np.testing.assert_array_equal(session.extend(ids[190:]), stepped[190:])
