"""The whole deploy forward in one native call (`NativePlan.step`, np_v3_step.h: embedding
rows, engram sites, every block, the wanted LM-head rows, scratch kept in the calling
thread's arena) against the three calls it replaces (`whole_step` off: engram, blocks,
read-out, the embedding gathered in numpy): the same logits and confidence cells, bit for
bit, for batches mixing prefill chunks, decode rows, extends and rows whose logits are not
wanted; with the arena growing and shrinking between calls, past the rows it is kept for,
from two threads at once, with the embedding passed in, and on every CPU variant in a fresh
process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import REPO_ROOT, get_fixture, toy_model_path
from v3_helpers import model

import needlepoint
from needlepoint.kernels import native
from needlepoint.models.needle3.native_block import ARENA_ROWS, native_plan


def _tokens(net, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, net.config.vocab, count)


def _walk(net, seed: int) -> list:
    """Logits and confidence logits of five sessions through run_batch rounds of every kind,
    then steps and a long extend (more rows than the arena keeps)."""
    rng = np.random.default_rng(seed)
    sessions = [net.session(chunk=32) for _ in range(5)]
    out = [net.run_batch([(s, _tokens(net, int(rng.integers(1, 40)), seed + i), False)
                          for i, s in enumerate(sessions)])]
    for r in range(4):
        requests = []
        for i, s in enumerate(sessions):
            count = (1, 3, 17, 1, 70)[(i + r) % 5]
            requests.append((s, _tokens(net, count, 100 * r + i), (i + r) % 2 == 0))
        out.append(net.run_batch(requests))
        out.append([s.confidence_logit() for s in sessions])
    out.append([s.prefill(_tokens(net, 5, 9 + i), logits=False) for i, s in enumerate(sessions)])
    out.append([s.step(3) for s in sessions])
    out.append([sessions[0].extend(_tokens(net, ARENA_ROWS + 9, 5))])
    return out


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x, y, strict=True):
            if p is None or q is None:
                assert p is None and q is None
            else:
                np.testing.assert_array_equal(p, q)


def _three_calls(net):
    plan = native_plan(net)
    plan.whole_step = False
    try:
        return _walk(net, 1)
    finally:
        plan.whole_step = True


@pytest.mark.parametrize("name", ["tiny", "small", "toy"])
def test_whole_step_equals_the_three_calls(name):
    net = needlepoint.load(toy_model_path(), cache=False) if name == "toy" else model(name)
    plan = native_plan(net)
    assert plan is not None and plan.whole_step and plan.native_embed
    np.testing.assert_equal(plan.whole_step, True)
    whole = _walk(net, 1)
    _same(whole, _three_calls(net))


def test_whole_step_with_the_embedding_passed_in():
    """A model whose embedding the plan does not gather (`native_embed` off: the caller
    passes the scaled rows) gives the same bits."""
    net = model("tiny")
    plan = native_plan(net)
    expected = _walk(net, 2)
    saved = plan.model.emb_packed, plan.native_embed
    plan.model.emb_packed, plan.native_embed = None, False
    try:
        got = _walk(net, 2)
    finally:
        plan.model.emb_packed, plan.native_embed = saved
    _same(got, expected)


def test_two_threads_each_use_their_own_arena():
    """Sessions of one model stepped from two threads at once (each thread's arena) give
    the bits each gives alone."""
    net = model("tiny")
    ids = [_tokens(net, 30, 40 + i) for i in range(2)]

    def run(i, out):
        s = net.session()
        rows = [s.prefill(ids[i][:20])]
        rows += [s.step(int(t)) for t in ids[i][20:]]
        out[i] = rows

    alone: dict = {}
    for i in range(2):
        run(i, alone)
    together: dict = {}
    threads = [threading.Thread(target=run, args=(i, together)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        _same([together[i]], [alone[i]])


@pytest.mark.parametrize("variant", ["0", "1", "2"])
def test_whole_step_on_each_variant_in_a_fresh_process(variant, tmp_path):
    """The one call on each compiled variant (a fresh process: the variant is picked once)
    against the numpy reference here, on a geometry whose query heads share kv heads (the
    grouped attention rows, np_att_rows)."""
    names = {"0": "baseline", "1": "avx2+fma", "2": "avx512vnni"}
    flags = open("/proc/cpuinfo").read().split()
    if variant == "2" and not {"avx512bw", "avx512vl", "avx512_vnni"} <= set(flags):
        pytest.skip("this CPU has no AVX-512 VNNI: that variant cannot run here")
    if variant == "1" and not {"avx2", "fma"} <= set(flags):
        pytest.skip("this CPU has no AVX2: that variant cannot run here")
    fixture = get_fixture("needle3", "small")  # 3 query heads per kv head: np_att_rows
    prompt = fixture.arrays["p2_tokens"][:24]
    saved = native.LIBRARY
    native.LIBRARY = None
    try:
        session = model("small").session()
        expected = [session.prefill(prompt[:16])] + [session.step(int(t)) for t in prompt[16:]]
    finally:
        native.LIBRARY = saved
    out = tmp_path / "logits.npy"
    script = (
        "import numpy as np, needlepoint; from needlepoint.kernels import native; "
        f"assert native.simd_variant() == {names[variant]!r}, native.simd_variant(); "
        f"m = needlepoint.load({str(fixture.cact)!r}, cache=False); "
        "assert m.num.native_plan(m).whole_step; "
        f"p = {prompt.tolist()}; s = m.session(); "
        "rows = [s.prefill(p[:16])] + [s.step(t) for t in p[16:]]; "
        f"np.save({str(out)!r}, np.stack(rows))"
    )
    env = dict(os.environ, NEEDLEPOINT_NATIVE_VARIANT=variant)
    env.pop("NEEDLEPOINT_NATIVE", None)  # the native step, whatever this run uses
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=REPO_ROOT,
                   timeout=120)
    np.testing.assert_array_equal(np.load(out), np.stack(expected))


def test_a_step_of_decode_draft_and_prompt_rows_is_one_pass(monkeypatch):
    """A run_batch call within PASS_ROWS (a scheduler step: decode rows, a draft extend and a
    prompt spanning several of its session's chunks) is one forward, and each request gets
    the bits it gets alone; a longer call runs in rounds of the sessions' chunks."""
    from needlepoint.models.needle3 import batch  # noqa: PLC0415

    net = model("tiny")
    prompts = [_tokens(net, 12, 60 + i) for i in range(5)]
    long_prompt = _tokens(net, 300, 70)
    calls: list[int] = []
    real = batch.forward

    def counted(m, items):
        calls.append(sum(len(item.tokens) for item in items))
        return real(m, items)

    def run(together: bool):
        sessions = [net.session(chunk=32) for _ in range(5)]
        for s, p in zip(sessions, prompts, strict=True):
            s.prefill(p)
        requests = [(sessions[0], [5], False), (sessions[1], [6], False),
                    (sessions[2], [7], False), (sessions[3], [8, 9, 10], True),
                    (sessions[4], long_prompt[:200], False)]
        if together:
            monkeypatch.setattr(batch, "forward", counted)
            out = net.run_batch(requests)
            monkeypatch.setattr(batch, "forward", real)
        else:
            out = [s.extend(ids) if every else s.prefill(ids) for s, ids, every in requests]
        return out, sessions

    together, sessions = run(True)
    alone, _ = run(False)
    assert calls == [206]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_array_equal(a, b)
    calls.clear()
    monkeypatch.setattr(batch, "forward", counted)
    assert batch.PASS_ROWS < 300 + 260
    net.run_batch([(net.session(chunk=32), long_prompt, False),
                   (net.session(chunk=32), long_prompt[:260], False)])
    assert calls == [64] * 8 + [36, 12]


def test_the_16_key_copy_is_kept_by_either_store():
    """Keys stored by the numpy reference (`Int8LayerCache.write`) and by the native step
    carry the same 16-key copy (np_v3_cache.ktile / ksum, which the native scores read): a
    session prefilled by the reference, forked, then stepped natively gives the reference's
    bits, and its copies equal a natively prefilled session's slot for slot."""
    net = model("small")
    ids = _tokens(net, 40, 11)
    saved = native.LIBRARY
    native.LIBRARY = None
    try:
        alone = net.session()
        expected = [alone.prefill(ids[:30])] + [alone.step(int(t)) for t in ids[30:]]
        mixed = net.session()
        first = mixed.prefill(ids[:30])
    finally:
        native.LIBRARY = saved
    stepped = mixed.fork()
    _same([[first] + [stepped.step(int(t)) for t in ids[30:]]], [expected])
    natively = net.session()
    natively.prefill(ids[:30])
    for a, b in zip(mixed.caches, natively.caches, strict=True):
        assert a.ktile.size and a.ksum.size
        np.testing.assert_array_equal(a.ktile, b.ktile)
        np.testing.assert_array_equal(a.ksum, b.ksum)
