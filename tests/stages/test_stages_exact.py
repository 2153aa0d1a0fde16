"""A model cut into stages (in-process transport) gives the single-process logits bit for bit
in deploy numerics, for every split: K = 1..L stages at any cut points, through `forward`,
`prefill` in chunks of any size (pipelined: several chunks in flight), decode steps,
`extend`, forked sessions, kv-window rings, ladder rungs and `run_batch`. Float numerics
give the same bits too: the single process and the stages run the one forward (a step is a
chunk of one position) on the same shapes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import toy_model_path
from stages_helpers import (
    all_cut_sets,
    assert_bits,
    assert_confidence,
    fixture_path,
    long_prompt,
    stepped,
)
from v3_helpers import model

import needlepoint
from needlepoint.stages import StagedModel, load_staged


@pytest.fixture(scope="module")
def toy():
    return needlepoint.load(toy_model_path(), cache=False)


def _staged(path, stages, **options) -> StagedModel:
    return load_staged(path, stages, cache=False, **options)


def _small_prefilled(count: int, upto: int) -> tuple[np.ndarray, Any]:
    """`count` prompt ids for the small fixture and a single-process session that has
    consumed the first `upto` of them (the reference the staged sessions are held to)."""
    ids = long_prompt("small", count)
    session = model("small").session()
    session.prefill(ids[:upto])
    return ids, session


@pytest.mark.parametrize("name", ["tiny", "toy"])
def test_every_split_of_a_four_layer_model(name, toy):
    """All 8 ways of cutting 4 blocks: forward, pipelined prefill (chunks of 16) and steps."""
    path = toy_model_path() if name == "toy" else fixture_path(name)
    reference = toy if name == "toy" else model(name)
    ids = long_prompt("tiny", 120) % reference.config.vocab
    expected = reference.forward(ids)
    steps = stepped(reference.session(), ids[:70], first=60)
    for cuts in all_cut_sets(reference.config.num_layers):
        with _staged(path, cuts) as staged:
            assert staged.plan.cuts == tuple(cuts)
            assert_bits(staged.forward(ids), expected, f"forward {cuts}")
            session = staged.session(chunk=16)
            assert_bits(session.prefill(ids), expected[-1], f"prefill {cuts}")
            assert_bits(stepped(staged.session(chunk=16), ids[:70], first=60), steps,
                        f"extend + steps {cuts}")


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6, 7, 8])
def test_small_in_one_to_eight_balanced_stages(stages):
    reference = model("small")
    ids = long_prompt("small", 300)
    expected = reference.forward(ids)
    with _staged(fixture_path("small"), stages) as staged:
        assert len(staged.plan) == stages
        assert_bits(staged.forward(ids), expected, f"forward, {stages} stages")
        session = staged.session(chunk=64)
        assert_bits(session.prefill(ids[:280]), expected[279])
        assert_bits(np.stack([session.step(int(t)) for t in ids[280:]]), expected[280:])


@pytest.mark.parametrize("cuts", [[0, 1], [0, 7], [0, 3, 4], [0, 2, 5, 6], [0, 1, 2, 3, 6]])
def test_small_at_uneven_cut_points(cuts):
    reference = model("small")
    ids = long_prompt("small", 200)
    with _staged(fixture_path("small"), cuts) as staged:
        assert_bits(staged.forward(ids), reference.forward(ids), f"forward {cuts}")


@pytest.mark.parametrize("stages", [2, 4, [0, 19], 20])
def test_shipped_geometry(stages):
    """20 blocks of the shipped geometry: 2, 4, an uneven 19+1 and one block per stage."""
    reference = model("shipped")
    ids = long_prompt("shipped", 80)
    expected = reference.forward(ids)
    with _staged(fixture_path("shipped"), stages) as staged:
        assert_bits(staged.forward(ids), expected, f"forward {stages}")
        session = staged.session(chunk=32)
        assert_bits(session.prefill(ids[:76]), expected[75])
        assert_bits(np.stack([session.step(int(t)) for t in ids[76:]]), expected[76:])


def test_kv_window_rings_wrap_around_across_stages():
    """tiny's 48-slot rings wrap several times in 256 tokens; prefill in odd chunks, then
    step: the single process's stepped bits."""
    reference = model("tiny")
    ids = long_prompt("tiny", 256)
    window = reference.config.kv_window
    expected = stepped(reference.session(kv_window=window), ids)
    with _staged(fixture_path("tiny"), [0, 1, 3]) as staged:
        session = staged.session(kv_window=window, chunk=37)
        assert_bits(session.prefill(ids[:150]), expected[149])
        for position in range(150, len(ids)):
            assert_bits(session.step(int(ids[position])), expected[position], f"step {position}")
        single = reference.session(kv_window=window)
        single.prefill(ids, logits=False)
        assert_confidence(session.confidence_logit(), single.confidence_logit())


def test_forked_sessions_continue_independently():
    ids, base = _small_prefilled(140, 100)
    branch = base.fork()
    expected_a = [base.step(int(t)) for t in ids[100:110]]
    expected_b = [branch.step(int(t)) for t in ids[120:130]]
    with _staged(fixture_path("small"), 3) as staged:
        session = staged.session()
        session.prefill(ids[:100])
        other = session.fork()
        got_b = [other.step(int(t)) for t in ids[120:130]]
        got_a = [session.step(int(t)) for t in ids[100:110]]
        assert_bits(np.stack(got_a), np.stack(expected_a), "parent")
        assert_bits(np.stack(got_b), np.stack(expected_b), "fork")
        assert session.position == 110 and other.position == 110
        assert np.array_equal(other.consumed(), np.concatenate([ids[:100], ids[120:130]]))


def test_many_sessions_at_once_and_run_batch():
    reference = model("tiny")
    prompts = [long_prompt("tiny", n)[k:] for k, n in ((0, 40), (5, 90), (9, 140))]
    expected = [reference.forward(p) for p in prompts]
    with _staged(fixture_path("tiny"), 2) as staged:
        sessions = [staged.session(chunk=32) for _ in prompts]
        # interleaved: each session's stage caches are its own
        for first in range(0, 140, 10):
            for session, ids, rows in zip(sessions, prompts, expected, strict=True):
                if first < len(ids):
                    assert_bits(session.extend(ids[first : first + 10]), rows[first : first + 10])
        fresh = [staged.session(chunk=16) for _ in prompts]
        out = staged.run_batch([(s, p, every) for s, p, every in
                                zip(fresh, prompts, [True, False, True], strict=True)])
        assert_bits(out[0], expected[0])
        assert_bits(out[1], expected[1][-1])
        assert_bits(out[2], expected[2])
        info = staged.stage_info()
        assert [i["sessions"] for i in info] == [6, 6]


def test_ladder_rung_in_stages():
    reference = needlepoint.load(fixture_path("small"), layers=5)
    ids = long_prompt("small", 100)
    with _staged(fixture_path("small"), [0, 2, 3], layers=5) as staged:
        assert staged.config.num_layers == 5
        assert_bits(staged.forward(ids), reference.forward(ids), "rung of 5")


def test_confidence_head_pools_across_stages():
    ids, session = _small_prefilled(150, 140)
    reference = model("small")
    expected = session.confidence_logit()
    with _staged(fixture_path("small"), [0, 3, 6]) as staged:
        assert staged.has_confidence_head
        mine = staged.session(chunk=48)
        mine.prefill(ids[:140], logits=False)
        assert_confidence(mine.confidence_logit(), expected)
        assert_confidence(staged.confidence_logit(ids), reference.confidence_logit(ids))
        branch = mine.fork()
        branch.step(int(ids[140]))
        session.step(int(ids[140]))
        assert_confidence(branch.confidence_logit(), session.confidence_logit())


def test_float_numerics_forward_prefill_and_steps_are_bit_identical():
    reference = model("small", numerics="float")
    ids = long_prompt("small", 200)
    expected = reference.forward(ids)
    with _staged(fixture_path("small"), [0, 3, 5], numerics="float") as staged:
        assert_bits(staged.forward(ids), expected, "float forward")
        assert_bits(staged.session().prefill(ids[:150]), reference.session().prefill(ids[:150]))
        session = staged.session()
        session.prefill(ids[:150])
        single = reference.session()
        single.prefill(ids[:150])
        for token in ids[150:160]:
            assert_bits(session.step(int(token)), single.step(int(token)), "float step")
        # a step's confidence cells reach each stage's pool at the cell rows of its blocks
        assert session.confidence_logit() == single.confidence_logit()
