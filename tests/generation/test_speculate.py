"""Speculative decoding (`generation/speculate.py`): how a draft is fed, accepted, rewound
and settled, on a transparent fake session; when speculation applies (and the fallback to
plain steps when it does not); and, on the toy model's real turns, that it takes fewer
passes while producing the same tokens and leaving the session as plain stepping does.

The invariant over random inputs is `test_speculate_property.py`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import shared_dir, toy_model_path

import needlepoint
from needlepoint.errors import NonFiniteActivationError
from needlepoint.formats.needle_wire import prompt_ids, render_prompt
from needlepoint.generation.draft_policy import DraftPolicy, policy_for
from needlepoint.generation.drafts import LOOKUP, Drafter, DraftState, NgramIndex
from needlepoint.generation.grammar import TokenVocab, ToolCallGrammar
from needlepoint.generation.speculate import (
    LOOKUP_MAX,
    PlainStepper,
    Speculator,
    speculation_supported,
    stepper,
)
from needlepoint.generation.turn import GenerationConfig, TurnVocab, run_turn
from needlepoint.models.protocol import SessionCapabilities

VOCAB = 32


class LogSession:
    """A model whose logits after a prefix are a pure function of it, with exact `extend`
    and `rewind`; it logs every call."""

    exact = True  # extend rows are the bits of single steps
    chunk: int | None = None  # a prefill chunk, when a test gives it one

    @property
    def capabilities(self) -> SessionCapabilities:
        return SessionCapabilities(extend=True, rewind=True, exact=self.exact,
                                   chunk=self.chunk)

    def __init__(self, poison: int | None = None) -> None:
        self.ids: list[int] = []
        self.calls: list[tuple[str, int]] = []
        self.poison = poison  # extend raises NonFiniteActivationError on this token

    @property
    def position(self) -> int:
        return len(self.ids)

    def _row(self, upto: int) -> np.ndarray:
        rng = np.random.default_rng(self.ids[:upto])
        return rng.normal(size=VOCAB).astype(np.float32)

    def prefill(self, ids, logits=True):
        self.calls.append(("prefill", len(ids)))
        self.ids.extend(int(t) for t in ids)
        return self._row(len(self.ids)) if logits else None

    def step(self, token):
        self.calls.append(("step", 1))
        self.ids.append(int(token))
        return self._row(len(self.ids))

    def extend(self, ids):
        self.calls.append(("extend", len(ids)))
        if self.poison in ids:
            self.ids.append(int(ids[0]))  # fails part-way, after consuming a token
            raise NonFiniteActivationError("poisoned draft")
        start = len(self.ids)
        self.ids.extend(int(t) for t in ids)
        return np.stack([self._row(start + i + 1) for i in range(len(ids))])

    def rewind(self, n):
        self.calls.append(("rewind", n))
        del self.ids[len(self.ids) - n :]


def _speculator(session, index_tokens=(), ratio=0.0, **kwargs):
    """A speculator that verifies whole drafts (ratio 0: an extra position costs nothing)."""
    index = NgramIndex()
    index.extend(list(index_tokens))
    return Speculator(session, Drafter(index), lambda: DraftState(),
                      policy=DraftPolicy(ratio=ratio), **kwargs)


def test_draft_accepted_prefix_plus_one_then_rewind():
    session = LogSession()
    spec = _speculator(session)
    spec.prefill([1, 2, 3, 4, 5, 9, 1, 2])  # the tail "1 2" continued with 3 4 5 9 ...
    row = spec.step(3)  # a pass: [3] + draft (lookup after "2 3": 4 5 9 1 2 3 4 5 9 ...)
    assert session.calls[-1] == ("extend", 1 + LOOKUP_MAX) and spec.passes == 1
    assert spec.position == 9 and session.position == 9 + LOOKUP_MAX
    reference = LogSession()
    reference.prefill([1, 2, 3, 4, 5, 9, 1, 2], logits=False)
    assert np.array_equal(row, reference.step(3))
    for token in (4, 5):  # the picks agree with the draft: rows at no cost
        assert np.array_equal(spec.step(token), reference.step(token))
    assert spec.passes == 1 and spec.accepted[LOOKUP] == 2
    assert np.array_equal(spec.step(7), reference.step(7))  # disagrees: rewind, new pass
    assert ("rewind", LOOKUP_MAX - 2) in session.calls and spec.passes == 2
    assert spec.position == reference.position
    spec.settle()
    assert session.ids == reference.ids and not spec.ahead
    stats = spec.stats()
    assert stats["decode_passes"] == 2 and stats["lookup_drafted"] >= LOOKUP_MAX
    assert stats["lookup_accepted"] == 2 and stats["grammar_drafted"] == 0


def test_empty_draft_is_a_plain_step():
    session = LogSession()
    spec = _speculator(session)
    spec.prefill([1, 2])
    spec.step(3)  # nothing to look up: a plain step
    assert session.calls[-1] == ("step", 1) and spec.passes == 1


def test_policy_cuts_drafts_where_they_stop_paying_off():
    policy = DraftPolicy(ratio=0.2)
    # grammar tokens are nearly sure: many are kept; a first lookup token (prior 0.3) is
    # kept, the reach after it falls below 0.2 within a few continuing tokens
    assert policy.keep(["grammar"] * 20) == 20
    assert policy.keep(["lookup1", "lookup1+", "lookup1+", "lookup1+"]) == 1
    assert DraftPolicy(ratio=0.4).keep(["lookup1", "grammar"]) == 0
    assert DraftPolicy(ratio=0.0).keep(["lookup1"] * 30) == 30
    # acceptance is learnt per kind
    for _ in range(40):
        policy.reached("lookup3", True)
        policy.reached("lookup3+", True)
        policy.reached("lookup1", False)
    assert policy.rate("lookup3") > 0.9 and policy.rate("lookup1") < 0.1
    assert policy.keep(["lookup3", "lookup3+", "lookup3+"]) == 3
    assert policy.keep(["lookup1"]) == 0
    # the ratio is timed: slope per extra position over a one-position pass
    timed = DraftPolicy()
    timed.timed(1, 0.010)
    timed.timed(5, 0.018)
    assert timed.ratio() == pytest.approx(0.2)
    timed.timed(1, 0.010)
    timed.timed(2, 0.5)  # two positions: too few to tell the slope, ignored
    assert timed.ratio() == pytest.approx(0.2)


def test_batched_steps_price_a_draft_row_at_what_a_row_yields():
    """In a batch a draft token is kept while its reach beats B / R, the tokens a row of the
    step yields (module doc); a step of one session returns to the timed ratio."""
    policy = DraftPolicy()
    policy.timed(1, 0.010)
    policy.timed(5, 0.011)  # a batch's wall times: extra rows look free
    assert policy.ratio() == pytest.approx(0.025)
    assert policy.keep(["lookup1", "lookup1+", "lookup1+"]) == 3
    policy.batched(8, 10)  # 8 decoders, 2 draft rows
    assert policy.ratio() == pytest.approx(0.8)
    assert policy.keep(["lookup1"]) == 0 and policy.keep(["grammar"] * 3) == 3
    policy.batched(4, 16)  # a running average over steps
    assert policy.ratio() == pytest.approx(0.8 * 0.8 + 0.2 * 0.25)
    policy.batched(0, 128)  # prompts only: says nothing about drafts
    policy.batched(3, 2)  # fewer rows than decoders cannot happen: ignored
    assert policy.ratio() == pytest.approx(0.8 * 0.8 + 0.2 * 0.25)
    policy.batched(1, 3)  # one session: its own timings again
    assert policy.ratio() == pytest.approx(0.025)
    assert DraftPolicy(ratio=0.3).ratio() == 0.3  # a fixed ratio wins
    fixed = DraftPolicy(ratio=0.3)
    fixed.batched(8, 9)
    assert fixed.ratio() == 0.3


def test_acceptance_is_counted_on_reached_tokens_and_shared_per_model():
    session = LogSession()
    policy = DraftPolicy(ratio=0.0)
    spec = Speculator(session, Drafter(NgramIndex()), lambda: DraftState(), policy=policy)
    spec.drafter.index.extend([2, 3, 4, 6])
    spec.prefill([7])
    spec.step(2)  # drafts 3 4 6 7 2 ...: 3 accepted, 4 rejected (9), the rest never reached
    spec.step(3)
    spec.step(9)
    counts = {kind: tuple(c) for kind, c in policy.counts.items()}
    assert sum(c[1] for c in counts.values()) == 2 and sum(c[0] for c in counts.values()) == 1
    model = needlepoint.load(toy_model_path())
    assert policy_for(model) is policy_for(model)
    assert policy_for(None) is not policy_for(None)  # no model: fresh


def test_room_limits_drafts_to_the_context_and_the_turn():
    session = LogSession()
    spec = _speculator(session, limit=12)
    spec.prefill([1, 2, 3, 4, 5, 6, 1, 2])
    spec.step(3)  # the token at 8, drafts at 9..11: at most 3
    assert session.calls[-1] == ("extend", 4)
    spec = _speculator(LogSession(), max_steps=3)
    spec.prefill([1, 2, 3, 4, 5, 6, 1, 2])
    spec.step(3)  # this step and 2 more: the draft has 2 tokens
    assert spec.session.calls[-1] == ("extend", 3)


def test_opening_is_drafted_with_the_prompt_in_its_last_chunk():
    session = LogSession()
    session.chunk = 4
    spec = _speculator(session, opening=[20, 21])
    row = spec.prefill([1, 2, 3, 4, 5, 6])
    # [1..4] as a prefill chunk, then [5, 6] + the opening in one pass of <= 4 rows
    assert session.calls == [("prefill", 4), ("extend", 4)]
    reference = LogSession()
    assert np.array_equal(row, reference.prefill([1, 2, 3, 4, 5, 6]))
    assert np.array_equal(spec.step(20), reference.step(20)) and spec.passes == 0
    assert spec.accepted["opening"] == 1 and spec.drafted["opening"] == 2
    spec.step(9)
    assert ("rewind", 1) in session.calls


def test_opening_after_a_long_last_chunk_gets_a_pass_when_it_pays():
    prompt = list(range(1, 21))  # a last chunk of 20 rows: too many logits to compute
    session = LogSession()
    session.chunk = 128
    spec = _speculator(session, opening=[20, 21, 22], ratio=0.1)
    row = spec.prefill(prompt)
    assert session.calls == [("prefill", 19), ("extend", 4)]
    assert np.array_equal(row, LogSession().prefill(prompt))
    # when the opening is rarely written, a pass of its own does not pay: a plain prefill
    policy = DraftPolicy(ratio=0.1)
    for _ in range(20):
        policy.reached("opening", False)
    assert not policy.worth_pass(["opening"] * 3) and DraftPolicy(0.1).worth_pass(["opening"] * 3)
    assert not DraftPolicy(0.1).worth_pass(["opening"])  # one token never pays for a pass
    lazy = Speculator(LogSession(), Drafter(NgramIndex()), lambda: DraftState(),
                      policy=policy, opening=[20, 21, 22])
    lazy.prefill(prompt)
    assert lazy.session.calls == [("prefill", 20)] and not lazy.ahead
    # a session without `chunk` still gets the split
    plain = _speculator(LogSession(), opening=[20, 21, 22])
    plain.prefill([1, 2])
    assert plain.session.calls == [("prefill", 1), ("extend", 4)]


def test_a_failing_draft_falls_back_to_the_token_alone():
    session = LogSession(poison=9)
    spec = _speculator(session)
    spec.prefill([1, 2, 9, 8, 1])
    spec.step(2)  # the draft 9 8 ... poisons the pass: undo it and step 2 alone
    assert session.calls[-3:] == [("extend", 1 + LOOKUP_MAX), ("rewind", 1), ("step", 1)]
    assert session.ids == [1, 2, 9, 8, 1, 2] and spec.passes == 1
    session = LogSession(poison=20)  # the same for an opening drafted with the prompt
    spec = _speculator(session, opening=[20, 21, 22])
    row = spec.prefill([1, 2, 3])
    assert session.calls == [("prefill", 2), ("extend", 4), ("rewind", 1), ("prefill", 1)]
    assert np.array_equal(row, LogSession().prefill([1, 2, 3])) and not spec.ahead


def test_speculation_supported():
    toy = needlepoint.load(toy_model_path())
    assert speculation_supported(toy.session())
    assert not speculation_supported(needlepoint.load(toy_model_path(),
                                                      numerics="float").session())

    class Steps:
        position = 0
        capabilities = SessionCapabilities()  # the protocol's core only

        def prefill(self, ids, logits=True): ...

        def step(self, token): ...

    assert not speculation_supported(Steps())
    session = LogSession()
    assert speculation_supported(session)
    session.exact = False
    assert not speculation_supported(session)
    assert isinstance(stepper(Steps(), True, None, None), PlainStepper)
    assert isinstance(stepper(LogSession(), False, None, None), PlainStepper)
    assert not isinstance(stepper(LogSession(), False, None, None), Speculator)


# ---------------------------------------------------------------- real turns, toy model
@pytest.fixture(scope="module")
def toy():
    model = needlepoint.load(toy_model_path())
    return model, TurnVocab.from_tokenizer(model.tokenizer), TokenVocab.from_tokenizer(
        model.tokenizer)


def _examples(n):
    path = shared_dir() / "models" / "needle3-toy.eval.jsonl"
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle][:n]


class StepsOnly:
    """A session proxy without extend/rewind (what a scheduler proxy may look like)."""

    capabilities = SessionCapabilities()  # the protocol's core only

    def __init__(self, session):
        self.inner = session
        self.steps = 0

    @property
    def position(self):
        return self.inner.position

    def prefill(self, ids, logits=True):
        return self.inner.prefill(ids, logits=logits)

    def step(self, token):
        self.steps += 1
        return self.inner.step(token)


def test_toy_turns_take_fewer_passes_and_the_same_tokens(toy):
    model, vocab, grammar_vocab = toy
    tokens = passes = plain_passes = 0
    drafted = accepted = 0
    for example in _examples(12):
        ids = prompt_ids(model.tokenizer, render_prompt(example["tools"], example["query"]))
        grammar = ToolCallGrammar(grammar_vocab, example["tools"])
        config = GenerationConfig(max_new_tokens=80)
        sessions = {True: model.session(), False: model.session()}
        results = {spec: run_turn(sessions[spec], vocab, ids, GenerationConfig(
            max_new_tokens=80, speculate=spec), grammar, context_limit=512)
            for spec in (True, False)}
        assert results[True].tokens == results[False].tokens
        assert results[True].call_token_probs == results[False].call_token_probs
        assert sessions[True].position == sessions[False].position
        nxt = results[True].pending[0]
        assert np.array_equal(sessions[True].step(nxt), sessions[False].step(nxt))
        plain = results[False].speculation
        assert plain["decode_passes"] == len(results[False].tokens) - 1
        assert plain["lookup_drafted"] == plain["grammar_drafted"] == 0
        tokens += len(results[True].tokens)
        passes += results[True].decode_passes
        plain_passes += plain["decode_passes"]
        stats = results[True].speculation
        drafted += sum(v for k, v in stats.items() if k.endswith("_drafted"))
        accepted += sum(v for k, v in stats.items() if k.endswith("_accepted"))
        # a session without extend/rewind decodes the same tokens with plain steps
        proxy = StepsOnly(model.session())
        again = run_turn(proxy, vocab, ids, config, grammar, context_limit=512)
        assert again.tokens == results[True].tokens
        assert proxy.steps == again.decode_passes == len(again.tokens) - 1
    assert passes / tokens <= 0.5 < plain_passes / tokens
    assert 0 < accepted <= drafted
