"""The native deploy step (kernels/native/np_v3_block.h: every block of a batch of chunks in
one C call, then the read-out) against the numpy reference (`block.run_block`,
`batch.chunk_pass` with the native library off): the same logits, bit for bit
(`np.array_equal`), for batches of 1 to 16 sessions mixing prefill chunks, decode rows and
extends, rewinds across ring wrap-around, kv windows, 1 and 2 threads, and the baseline
variant, on every needle3 fixture and the bundled toy model."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import NEEDLE3_FIXTURES, REPO_ROOT, get_fixture, toy_model_path
from v3_helpers import model

import needlepoint
from needlepoint.kernels import native
from needlepoint.models.needle3.block import run_block
from needlepoint.models.needle3.native_block import native_plan


@contextlib.contextmanager
def numpy_reference():
    """Every kernel and the block path take their numpy reference inside the block."""
    saved = native.LIBRARY
    native.LIBRARY = None
    try:
        yield
    finally:
        native.LIBRARY = saved


def _toy():
    return needlepoint.load(toy_model_path(), cache=False)


def _net(name: str):
    return _toy() if name == "toy" else model(name)


def _tokens(net, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, net.config.vocab, count)


def _script(net, sessions: int, seed: int) -> list[list[tuple[int, np.ndarray, bool]]]:
    """Rounds of (session, ids, all_logits): prefills of mixed lengths, then rounds where
    some sessions decode one token, some extend a few, some prefill a longer piece."""
    rng = np.random.default_rng(seed)
    rounds = [[(i, _tokens(net, int(rng.integers(1, 40)), seed + i), False)
               for i in range(sessions)]]
    for r in range(3):
        rows = []
        for i in range(sessions):
            kind = (i + r) % 3
            count = (1, int(rng.integers(2, 6)), int(rng.integers(6, 30)))[kind]
            rows.append((i, _tokens(net, count, seed + 100 * r + i), kind == 1))
        rounds.append(rows)
    return rounds


def _run(net, rounds, sessions: int, batched: bool, **options) -> list:
    states = [net.session(**options) for _ in range(sessions)]
    out = []
    for requests in rounds:
        if batched:
            out.append(net.run_batch([(states[i], ids, every) for i, ids, every in requests]))
        else:
            out.append([states[i].extend(ids) if every else states[i].prefill(ids)
                        for i, ids, every in requests])
    return out


def _assert_same(got, expected) -> None:
    for got_round, expected_round in zip(got, expected, strict=True):
        for a, b in zip(got_round, expected_round, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("name", "sessions"),
                         [("tiny", 1), ("tiny", 5), ("tiny", 16), ("small", 3), ("toy", 16),
                          ("shipped", 2)])
def test_batched_native_step_equals_the_numpy_reference_alone(name, sessions):
    net = _net(name)
    assert native_plan(net) is not None
    rounds = _script(net, sessions, seed=sessions)
    if name == "shipped":  # the numpy reference is slow at this size: short pieces
        rounds = [[(i, ids[:6], every) for i, ids, every in rows] for rows in rounds[:3]]
    batched = _run(net, rounds, sessions, batched=True, chunk=16)
    with numpy_reference():
        assert native_plan(net) is None
        alone = _run(net, rounds, sessions, batched=False, chunk=16)
    _assert_same(batched, alone)


@pytest.mark.parametrize(("name", "chunk"), [("tiny", 37), ("tiny", 128), ("toy", 37)])
def test_native_rewind_and_extend_across_ring_wrap_around(name, chunk):
    """kv window rings (48 slots + 64 of slack) wrapped several times, with rewinds and
    extends, on the native step and on the reference; chunks of 128 are longer than a ring
    (the native step stores and attends them 64 positions at a time)."""
    net = _net(name)
    window = min(net.config.kv_window or 48, 48)
    ids = _tokens(net, 230, seed=7)

    def walk():
        session = net.session(kv_window=window, chunk=chunk)
        rows = [session.prefill(ids[:150])]
        rows += [session.step(int(t)) for t in ids[150:160]]
        session.rewind(7)
        rows.append(session.extend(ids[153:200]))
        other = session.fork()
        session.rewind(40)
        rows.append(session.extend(ids[160:230]))
        rows.append(other.prefill(ids[200:230]))
        return rows

    native_rows = walk()
    with numpy_reference():
        reference = walk()
    for a, b in zip(native_rows, reference, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_native_step_is_the_same_at_one_and_two_threads(name):
    """Long enough that the attention rows, the MLP rows and the products are split between
    the threads (np_v3_parallel, np_cq_matmul_threads)."""
    arrays = get_fixture("needle3", name).arrays
    ids = arrays["p1_tokens"][:12] if name == "shipped" else arrays["p3_tokens"][:160]
    two = needlepoint.load(get_fixture("needle3", name).cact, threads=2)
    assert native_plan(two) is not None and native_plan(two).model.threads == 2
    got = two.forward(ids)
    with numpy_reference():
        expected = model(name).forward(ids)
    np.testing.assert_array_equal(got, expected)


def test_run_block_native_equals_the_numpy_reference():
    """`block.run_block` (what a stage runs) on a block with an engram site and one
    without, for two sequences stacked, native vs numpy."""
    from needlepoint.models.needle3.attention import ChunkFrame  # noqa: PLC0415

    net = model("tiny")
    cfg = net.config
    results = []
    for use_native in (True, False):
        rng = np.random.default_rng(3)
        context = contextlib.nullcontext() if use_native else numpy_reference()
        with context:
            sessions = [net.session(), net.session()]
            for session, count in zip(sessions, (5, 9), strict=True):
                session.prefill(_tokens(net, count, count), logits=False)
            out = []
            for index, layer in enumerate(net.weights.layers):
                lanes = rng.standard_normal((7, cfg.mhc_lanes, cfg.d_model)).astype(np.float32)
                parts = [(slice(0, 3), sessions[0].caches[index],
                          ChunkFrame.build(net.step_plan, 5, 3)),
                         (slice(3, 7), sessions[1].caches[index],
                          ChunkFrame.build(net.step_plan, 9, 4))]
                site = None
                if layer.engram_site is not None:
                    site = (rng.standard_normal((7, cfg.d_model)).astype(np.float32),
                            rng.standard_normal((7, cfg.d_model)).astype(np.float32))
                before = lanes.copy()
                out.append(run_block(net, index, lanes, parts, site))
                np.testing.assert_array_equal(lanes, before)  # the input is not changed
        results.append(out)
    assert any(layer.engram_site is not None for layer in net.weights.layers)
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_baseline_variant_gives_the_same_batched_bits(tmp_path):
    """A fresh process on the baseline (non-AVX2) variant runs a batch of sessions through
    the native step: the same bits as the numpy reference here."""
    net = model("tiny")
    prompts = [get_fixture("needle3", "tiny").arrays[f"p{i}_tokens"][:30] for i in (1, 2, 3)]
    with numpy_reference():
        expected = [net.session(chunk=8).prefill(ids) for ids in prompts]
    out = tmp_path / "logits.npy"
    script = (
        "import numpy as np, needlepoint; from needlepoint.kernels import native; "
        "assert native.simd_variant() == 'baseline'; "
        f"m = needlepoint.load({str(get_fixture('needle3', 'tiny').cact)!r}, cache=False); "
        f"p = [np.array(x) for x in {[p.tolist() for p in prompts]}]; "
        "s = [m.session(chunk=8) for _ in p]; "
        f"np.save({str(out)!r}, np.stack(m.run_batch([(a, b, False) for a, b in zip(s, p)])))"
    )
    env = dict(os.environ, NEEDLEPOINT_NATIVE_VARIANT="0")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=REPO_ROOT,
                   timeout=120)
    np.testing.assert_array_equal(np.load(out), np.stack(expected))
