"""`rewind(n)` across stages (speculative decoding's undo): a rewound staged session is
exactly the session that never consumed those positions, on the head and on every stage
(Needle 3 deploy, transformer int8), as a single-process session is
(`tests/models/needle3/test_v3_rewind.py`); float numerics re-run the kept tokens. And the
speculation invariant on a staged model: a turn decoded with speculation gives the tokens the
single process gives without it. Expected values come from the single-process model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import get_fixture, shared_dir, toy_model_path
from hf_helpers import hf_fixture_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stages_helpers import assert_bits, assert_confidence, fixture_path
from v3_helpers import model

import needlepoint
from needlepoint.errors import ModelInputError
from needlepoint.formats.needle_wire import prompt_ids, render_prompt
from needlepoint.generation.events import TurnComplete
from needlepoint.generation.sampling import SamplingConfig
from needlepoint.generation.speculate import speculation_supported
from needlepoint.generation.turn import GenerationConfig, TurnVocab, generate_turn
from needlepoint.stages import load_staged


def _walk(session, ids: np.ndarray, expected: np.ndarray, vocab: int, seed: int,
          start: int = 60) -> None:
    """Random rejected drafts (extend, rewind all) and partly accepted ones, checked at every
    step against the single-process logits `expected` of `ids`."""
    session.prefill(ids[:start])
    position = start
    rng = np.random.default_rng(seed)
    while position < len(ids):
        k = int(rng.integers(1, 17))
        session.extend(rng.integers(20, vocab, k))  # a rejected draft
        session.rewind(k)
        assert session.position == position
        take = min(int(rng.integers(1, 12)), len(ids) - position)
        assert_bits(session.extend(ids[position : position + take]),
                    expected[position : position + take], f"after rewind at {position}")
        accepted = int(rng.integers(0, take + 1))
        session.rewind(take - accepted)
        position += accepted
        np.testing.assert_array_equal(session.consumed(), ids[:position])


@pytest.mark.parametrize("kv_window", [None, 48])
def test_needle3_rewind_across_stages_is_never_having_consumed(kv_window):
    net = model("tiny")
    ids = get_fixture("needle3", "tiny").arrays["p3_tokens"]  # 256 tokens, past every window
    reference = net.session(kv_window=kv_window)
    expected = reference.extend(ids)
    with load_staged(fixture_path("tiny"), [0, 1, 3], cache=False) as staged:
        session = staged.session(kv_window=kv_window, chunk=19)
        assert session.capabilities.exact
        _walk(session, ids, expected, net.config.vocab, seed=1)
        assert_bits(session.step(7), reference.step(7))
        straight = net.session(kv_window=kv_window)
        straight.prefill(np.concatenate([ids, [7]]))
        if kv_window is None:
            assert_confidence(session.confidence_logit(), straight.confidence_logit())


def test_needle3_rewound_confidence_and_limits():
    net = model("tiny")
    ids = get_fixture("needle3", "tiny").arrays["p3_tokens"][:150]
    straight = net.session()
    straight.prefill(ids)
    with load_staged(fixture_path("tiny"), [0, 2], cache=False) as staged:
        session = staged.session()
        session.prefill(ids[:100])
        session.extend(np.full(40, 30))
        session.rewind(40)
        session.extend(ids[100:])
        assert_confidence(session.confidence_logit(), straight.confidence_logit())
        assert_bits(session.step(9), straight.step(9))
        with pytest.raises(ModelInputError, match="at most 64"):
            session.rewind(65)
        with pytest.raises(ModelInputError, match="count >= 0"):
            session.rewind(-1)
        with pytest.raises(ModelInputError, match="only 151 consumed"):
            session.rewind(152)


def test_transformer_rewind_across_stages():
    path = hf_fixture_dir("llama-tiny")
    reference = needlepoint.load(path, numerics="int8")
    ids = np.random.default_rng(4).integers(3, reference.config.vocab, 200)
    expected = reference.forward(ids)
    with load_staged(path, [0, 1, 3], numerics="int8") as staged:
        session = staged.session(chunk=9)
        _walk(session, ids, expected, reference.config.vocab, seed=2, start=30)
        session.rewind(150)  # transformer caches keep every position: no limit
        assert_bits(session.extend(ids[50:60]), expected[50:60])


def test_float_rewind_reruns_the_kept_tokens():
    net = model("tiny", numerics="float")
    ids = get_fixture("needle3", "tiny").arrays["p3_tokens"][:90]
    with load_staged(fixture_path("tiny"), [0, 2], numerics="float", cache=False) as staged:
        session = staged.session()
        assert not session.capabilities.exact
        session.prefill(ids[:70])
        session.extend(np.full(5, 40))
        session.rewind(5)
        fresh = net.session()
        fresh.prefill(ids[:70])
        np.testing.assert_allclose(session.step(int(ids[70])), fresh.step(int(ids[70])),
                                   rtol=0, atol=2e-4)


# -- speculative decoding on a staged model ----------------------------------------------------
@pytest.fixture(scope="module")
def toy_pair():
    single = needlepoint.load(toy_model_path())
    staged = load_staged(toy_model_path(), [0, 1, 3], cache=False)
    yield single, staged, TurnVocab.from_tokenizer(single.tokenizer)
    staged.close()


def _examples() -> list[dict]:
    with open(shared_dir() / "models" / "needle3-toy.eval.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle][:40]


EXAMPLES = _examples()


def _turn(model, vocab, ids, config):
    session = model.session()
    for event in generate_turn(session, vocab, ids, config):
        if isinstance(event, TurnComplete):
            return session, event.result
    raise AssertionError("no TurnComplete")


@settings(max_examples=8, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(example=st.sampled_from(EXAMPLES), temperature=st.sampled_from([0.0, 0.7, 1.2]),
       seed=st.integers(0, 2**31), budget=st.integers(8, 40))
def test_speculation_on_stages_gives_the_single_process_tokens(toy_pair, example, temperature,
                                                               seed, budget):
    single, staged, vocab = toy_pair
    ids = prompt_ids(single.tokenizer, render_prompt(example["tools"], example["query"]))
    sampling = SamplingConfig(temperature=temperature, seed=seed)
    plain_session, plain = _turn(single, vocab, ids, GenerationConfig(
        sampling=sampling, max_new_tokens=budget, speculate=False))
    spec_session, spec = _turn(staged, vocab, ids, GenerationConfig(
        sampling=sampling, max_new_tokens=budget, speculate=True))
    assert spec.tokens == plain.tokens
    assert (spec.text, spec.stop_reason) == (plain.text, plain.stop_reason)
    assert speculation_supported(spec_session)  # the staged session verifies drafts
    assert spec.decode_passes <= plain.decode_passes
    assert spec_session.position == plain_session.position
    if spec.pending:
        token = spec.pending[0]
        assert_bits(spec_session.step(token), plain_session.step(token), "after the turn")
