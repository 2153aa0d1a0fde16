"""The speculation invariant: for every input, seed and temperature, a turn decoded with
speculation produces exactly what it produces without (tokens, text, events, call
probabilities, log probabilities, stop reason), takes no more forward passes, and leaves the
session in the same state (same position; the next step's logits are the same bits).

Hypothesis draws the model (the trained toy model, the random-weight `tiny` Needle 3
fixture), the query (an eval-set query, optionally with random words) and its tool set (an
eval-set tool list, or random schemas from the grammar property test), the grammar on or off,
a content constraint, temperature (0 included), top-k / top-p, any int64 seed, the reasoning
budget, required / single calls, stop sequences, log probabilities, max_new_tokens, a
context limit that cuts the turn short, and a `kv_window` (ring caches shorter than the
prompt).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from conftest import get_fixture, shared_dir, toy_model_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_toolcall_property import random_tools

import needlepoint
from needlepoint.formats.needle_wire import prompt_ids, render_prompt
from needlepoint.generation.content import JSON_OBJECT, ContentGrammar
from needlepoint.generation.events import TurnComplete
from needlepoint.generation.grammar import TokenVocab, ToolCallGrammar
from needlepoint.generation.sampling import SamplingConfig
from needlepoint.generation.turn import GenerationConfig, TurnVocab, generate_turn

WORDS = ["please", "now", "tomorrow", "at", "7", "the", "kitchen", "Paris", "mum", "15",
         "minutes", "off", "set", "call", "music", "lights", "and", "then"]
_MODELS: dict[str, tuple] = {}


def _model(name: str):
    if name not in _MODELS:
        path = toy_model_path() if name == "toy" else get_fixture("needle3", "tiny").cact
        model = needlepoint.load(path)
        _MODELS[name] = (model, TurnVocab.from_tokenizer(model.tokenizer),
                         TokenVocab.from_tokenizer(model.tokenizer))
    return _MODELS[name]


@pytest.fixture(scope="module", autouse=True)
def _free_models():
    yield
    _MODELS.clear()


def _examples():
    with open(shared_dir() / "models" / "needle3-toy.eval.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle][:60]


EXAMPLES = _examples()


def _decode(model, vocab, ids, config, constraint, content, limit, kv_window):
    session = model.session(kv_window=kv_window)
    events, result = [], None
    for event in generate_turn(session, vocab, ids, config, constraint,
                               context_limit=limit, content=content):
        if isinstance(event, TurnComplete):
            result = event.result
        else:
            events.append((type(event).__name__, getattr(event, "text", None),
                           getattr(event, "entry", None)))
    return session, events, result


@st.composite
def cases(draw):
    name = draw(st.sampled_from(["toy", "toy", "tiny"]))
    example = draw(st.sampled_from(EXAMPLES))
    query = example["query"]
    extra = draw(st.lists(st.sampled_from(WORDS), max_size=4))
    if extra:
        query = f"{query} {' '.join(extra)}"
    tools = example["tools"]
    if draw(st.booleans()):
        tools = random_tools(random.Random(draw(st.integers(0, 2**32 - 1))))
    temperature = draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.5]))
    sampling = SamplingConfig(
        temperature=temperature,
        top_k=draw(st.sampled_from([None, 0, 5])),
        top_p=draw(st.sampled_from([1.0, 0.9])),
        seed=draw(st.integers(-(2**63), 2**63 - 1)))
    require = draw(st.booleans()) and draw(st.booleans())
    allow = require or draw(st.integers(0, 5)) > 0
    config = GenerationConfig(
        sampling=sampling,
        max_new_tokens=draw(st.integers(4, 48)),
        reasoning_budget=draw(st.sampled_from([None, 0, 3, 256])),
        require_call=require, allow_call=allow,
        stop=draw(st.sampled_from([(), ("e",), ("the",)])),
        logprobs=draw(st.sampled_from([None, None, 2])))
    return dict(name=name, query=query, tools=tools, config=config,
                grammar=draw(st.booleans()) or draw(st.booleans()),
                parallel=draw(st.booleans()) or draw(st.booleans()),
                content=(not require) and draw(st.integers(0, 5)) == 0,
                room=draw(st.sampled_from([None, None, None, 2, 9])),
                kv_window=draw(st.sampled_from([None, None, None, 40])))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_speculation_changes_nothing_but_the_passes(case):
    model, vocab, grammar_vocab = _model(case["name"])
    ids = prompt_ids(model.tokenizer, render_prompt(case["tools"], case["query"]))
    constraint = ToolCallGrammar(grammar_vocab, case["tools"], require_call=case[
        "config"].require_call, parallel_calls=case["parallel"]) if case["grammar"] else None
    content = None
    if case["content"]:
        m = vocab.markers
        content = ContentGrammar(grammar_vocab, JSON_OBJECT, im_end_id=m.im_end,
                                 tool_call_id=m.tool_call_open if case["config"].allow_call
                                 else None)
    limit = model.config.max_seq_len if case["room"] is None else len(ids) + case["room"]
    runs = {}
    for speculate in (False, True):
        config = GenerationConfig(**{**case["config"].__dict__, "speculate": speculate})
        runs[speculate] = _decode(model, vocab, ids, config, constraint, content, limit,
                                  case["kv_window"])
    (plain_session, plain_events, plain), (spec_session, spec_events, spec) = (
        runs[False], runs[True])
    assert spec.tokens == plain.tokens
    assert spec_events == plain_events  # per token, in the same order
    for field in ("reasoning", "text", "call_text", "call_closed", "stop_reason",
                  "call_token_probs", "forced_call", "seed", "pending", "logprobs"):
        assert getattr(spec, field) == getattr(plain, field), field
    assert spec.decode_passes <= plain.decode_passes == len(plain.tokens) - 1
    assert spec_session.position == plain_session.position
    if spec_session.position < limit and spec.pending:
        token = spec.pending[0]
        assert np.array_equal(spec_session.step(token), plain_session.step(token))
