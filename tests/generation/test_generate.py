"""The generator (prompt rendering, sampling, phases, grammar masking, streaming) on a scripted
session with the toy model's real tokenizer and the real tool-call grammar."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import get_fixture, toy_model_path
from fake_model import ScriptedModel, answer_ids
from turn_helpers import (  # noqa: F401 (fixtures, requested by name)
    ALARM,
    WEATHER,
    toy_tokenizer,
    toy_turn_vocab,
)

from needlepoint import open_archive
from needlepoint.api.conversation import Conversation
from needlepoint.api.envelope import combine_confidence, sigmoid, turn_envelope
from needlepoint.formats.needle_wire import (
    continuation_ids,
    date_fact,
    prompt_ids,
    render_prompt,
    render_tool_results,
    with_date,
)
from needlepoint.generation.events import ReasoningDelta, TextDelta, ToolCallDelta, TurnComplete
from needlepoint.generation.grammar import TokenVocab, ToolCallGrammar
from needlepoint.generation.sampling import (
    SamplingConfig,
    choose_token,
    position_rng,
    sampling_probs,
)
from needlepoint.generation.turn import GenerationConfig, generate_turn, run_turn

TOOLS = [ALARM, WEATHER]
ALARM_CALL = '[{"name":"set_alarm","arguments":{"time":"06:45"}}]'


@pytest.fixture(scope="module")
def grammar(tokenizer):
    return ToolCallGrammar(TokenVocab.from_tokenizer(tokenizer), TOOLS)


def prompt(tokenizer, query="wake me at 6:45"):
    return prompt_ids(tokenizer, render_prompt(TOOLS, query))


def events_of(model, vocab, config, constraint=None, query="wake me at 6:45"):
    session = model.session()
    return session, list(generate_turn(session, vocab, prompt(model.tokenizer, query), config,
                                       constraint))


# ------------------------------------------------------------------ prompt wire format
def _fixture_prompts(generation: str, name: str, keep) -> tuple:
    """A fixture archive's tokenizer and the sidecar prompts that `keep` selects."""
    fixture = get_fixture(generation, name)
    return open_archive(fixture.cact).tokenizer, [p for p in fixture.meta["prompts"] if keep(p)]


def _parse_fixture_prompt(text):
    """(system, tools, query) back out of a fixture prompt text."""
    system = ""
    m = re.match(r"<\|im_start\|>system\n(.*?)<\|im_end\|>\n", text, re.S)
    if m:
        system, text = m.group(1), text[m.end():]
    m = re.match(r"<\|im_start\|>user\n<tools>(.*)</tools>\n(.*)<\|im_end\|>\n"
                 r"<\|im_start\|>assistant\n$", text, re.S)
    return system, json.loads(m.group(1)), m.group(2)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_prompt_ids_match_fixture_wire_format(name):
    tokenizer, prompts = _fixture_prompts("needle3", name, lambda p: "<tools>" in p["text"])
    checked = 0
    for p in prompts:
        system, tools, query = _parse_fixture_prompt(p["text"])
        text = render_prompt(tools, query, system)
        assert text == p["text"]
        expected = p["token_ids"]
        expected = json.loads(expected) if isinstance(expected, str) else expected
        if p["target"] is None:
            assert prompt_ids(tokenizer, text) == expected
        else:  # teacher forced: [BOS] + encode(prompt) + encode(target) + [EOS]
            ids = prompt_ids(tokenizer, text) + tokenizer.encode(p["target"])
            assert ids + [tokenizer.eos_id] == expected
        checked += 1
    assert checked >= 3


def test_prompt_markers_are_single_ids_and_bos_first(tokenizer):
    ids = prompt(tokenizer)
    assert ids[0] == tokenizer.bos_id
    for marker in ("<|im_start|>", "<tools>", "</tools>", "<|im_end|>"):
        assert tokenizer.marker_id(marker) in ids
    assert ids.count(tokenizer.marker_id("<|im_start|>")) == 2
    assert '"name":"set_alarm","description"' in tokenizer.decode(ids)  # compact, key order


def test_system_facts_and_date():
    assert render_prompt([], "hi", "a: 1").startswith("<|im_start|>system\na: 1<|im_end|>\n")
    assert "system" not in render_prompt([], "hi", "")
    import datetime as dt

    now = dt.datetime(2026, 7, 21, 14, 30)
    assert date_fact(now) == "2026-07-21 Tue 14:30"
    assert with_date({"locale": "en-US"}, now) == "locale: en-US; date: 2026-07-21 Tue 14:30"
    assert with_date("date: 2020-01-01 Wed 00:00") == "date: 2020-01-01 Wed 00:00"


def test_continuation_has_no_dummy_space(tokenizer):
    text = "\n<|im_start|>user\n" + render_tool_results([{"name": "x", "result": 1}])
    ids = continuation_ids(tokenizer, text)
    assert tokenizer.token_bytes(ids[0]) == b"\n"
    assert tokenizer.decode_bytes([tokenizer.marker_id("<|im_end|>")] + ids).decode() == \
        "<|im_end|>" + text


# ------------------------------------------------------------------ sampling
def test_greedy_is_argmax_first_on_ties():
    logits = np.array([0.0, 3.0, 3.0, -1.0])
    assert choose_token(logits, SamplingConfig(), position=0, seed=0) == 1
    allowed = np.array([True, False, True, True])
    assert choose_token(logits, SamplingConfig(), position=0, seed=0, allowed=allowed) == 2


def test_position_rng_is_a_function_of_seed_and_position():
    a = [position_rng(7, p).random() for p in range(5)]
    b = [position_rng(7, p).random() for p in reversed(range(5))][::-1]
    assert a == b
    assert len(set(a)) == 5
    assert position_rng(8, 0).random() != a[0]


def test_sampled_frequencies_follow_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    config = SamplingConfig(temperature=1.0)
    draws = [choose_token(logits, config, position=p, seed=3) for p in range(4000)]
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert np.allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_top_k_top_p_and_mask():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = sampling_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert np.allclose(probs, [0.625, 0.375, 0, 0])
    probs = sampling_probs(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert np.allclose(probs, [0.625, 0.375, 0, 0])
    probs = sampling_probs(logits, SamplingConfig(temperature=1.0, top_p=0.4))
    assert np.allclose(probs, [1, 0, 0, 0])
    allowed = np.array([False, False, True, True])
    for p in range(50):
        token = choose_token(logits, SamplingConfig(temperature=1.0), position=p, seed=1,
                             allowed=allowed)
        assert token in (2, 3)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0.0), dict(top_k=-2)])
def test_sampling_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


# ------------------------------------------------------------------ turns
def test_greedy_call_follows_the_model(tokenizer, vocab, grammar):
    script = answer_ids(tokenizer, f"<tool_call>{ALARM_CALL}</tool_call><|im_end|>")
    model = ScriptedModel(tokenizer, script)
    session, events = events_of(model, vocab, GenerationConfig(), grammar)
    result = events[-1].result
    assert result.tokens == script
    assert result.call_text == ALARM_CALL
    assert "".join(e.text for e in events if isinstance(e, ToolCallDelta)) == ALARM_CALL
    envelope = turn_envelope(result)
    assert envelope["type"] == "call"
    assert envelope["function_calls"] == [{"name": "set_alarm", "arguments": {"time": "06:45"}}]
    # Prefill is one batched call asking for the last logits only; the stop token is not fed.
    assert len(session.prefills) == 1 and session.prefills[0][1] is True
    assert session.steps == script[:-1]
    assert result.pending == [tokenizer.marker_id("<|im_end|>")]


def test_grammar_masks_undeclared_tool(tokenizer, vocab, grammar):
    bad = '[{"name":"launch_rocket","arguments":{"time":"06:45"}}]'
    script = answer_ids(tokenizer, f"<tool_call>{bad}</tool_call><|im_end|>")
    free = run_turn(ScriptedModel(tokenizer, script).session(), vocab, prompt(tokenizer),
                    GenerationConfig())
    assert free.call_text == bad  # without the grammar the model's choice goes through
    constrained = run_turn(ScriptedModel(tokenizer, script).session(), vocab, prompt(tokenizer),
                           GenerationConfig(), grammar)
    envelope = turn_envelope(constrained)
    assert envelope["type"] in ("call", "refuse")
    assert all(c["name"] in ("set_alarm", "get_weather") for c in envelope["function_calls"])
    assert constrained.stop_reason == "end"


def test_think_then_call_streams_incrementally(tokenizer, vocab, grammar):
    answer = f"<think>\nthe user wants an alarm\n</think>\n<tool_call>{ALARM_CALL}</tool_call>"
    script = answer_ids(tokenizer, answer + "<|im_end|>")
    model = ScriptedModel(tokenizer, script)
    session = model.session()
    seen_at = []
    for event in generate_turn(session, vocab, prompt(tokenizer), GenerationConfig(), grammar):
        seen_at.append((event, len(session.steps)))
    kinds = [type(e).__name__ for e, _ in seen_at]
    assert kinds.index("ReasoningDelta") < kinds.index("ToolCallDelta")
    first_reasoning_step = next(n for e, n in seen_at if isinstance(e, ReasoningDelta))
    assert first_reasoning_step < len(script) // 2  # streamed while decoding, not after
    result = seen_at[-1][0].result
    assert result.reasoning == "the user wants an alarm"
    assert "".join(e.text for e, _ in seen_at if isinstance(e, ReasoningDelta)) == \
        result.reasoning
    assert turn_envelope(result)["reasoning"] == "the user wants an alarm"


def test_plain_answer_is_respond(tokenizer, vocab, grammar):
    script = answer_ids(tokenizer, "Hello there!<|im_end|>")
    session, events = events_of(ScriptedModel(tokenizer, script), vocab, GenerationConfig(),
                                grammar)
    envelope = turn_envelope(events[-1].result)
    assert envelope["type"] == "respond"
    assert envelope["text"] == "Hello there!"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello there!"


def test_refusal_is_refuse(tokenizer, vocab, grammar):
    script = answer_ids(tokenizer, "<tool_call>[]</tool_call><|im_end|>")
    result = run_turn(ScriptedModel(tokenizer, script).session(), vocab, prompt(tokenizer),
                      GenerationConfig(), grammar)
    assert turn_envelope(result)["type"] == "refuse"


def test_reasoning_budget_forces_the_call(tokenizer, vocab, grammar):
    rambling = answer_ids(tokenizer, "<think>\n" + "la " * 200)
    model = ScriptedModel(tokenizer, rambling)
    result = run_turn(model.session(), vocab, prompt(tokenizer),
                      GenerationConfig(reasoning_budget=12, max_new_tokens=200), grammar)
    assert result.forced_call
    close = continuation_ids(tokenizer, "\n</think>\n")
    start = 12
    assert result.tokens[start:start + len(close) + 1] == close + [vocab.markers.tool_call_open]
    assert result.call_closed and result.stop_reason == "end"
    json.loads(result.call_text)


def test_budget_zero_forces_call_as_trained(tokenizer, vocab, grammar):
    model = ScriptedModel(tokenizer, answer_ids(tokenizer, "Hello"))
    result = run_turn(model.session(), vocab, prompt(tokenizer),
                      GenerationConfig(reasoning_budget=0), grammar)
    assert result.tokens[:2] == tokenizer.encode("<tool_call>")  # dummy-prefix space first
    assert result.forced_call and result.call_closed


def test_require_call_forbids_ending_without_call(tokenizer, vocab, grammar):
    model = ScriptedModel(tokenizer, answer_ids(tokenizer, "<|im_end|>"), strength=30)
    result = run_turn(model.session(), vocab, prompt(tokenizer),
                      GenerationConfig(require_call=True, reasoning_budget=3), grammar)
    assert vocab.markers.im_end not in result.tokens[:3]
    assert result.call_text is not None


def test_max_new_tokens_stops(tokenizer, vocab):
    model = ScriptedModel(tokenizer, answer_ids(tokenizer, "la " * 100))
    result = run_turn(model.session(), vocab, prompt(tokenizer),
                      GenerationConfig(max_new_tokens=7, reasoning_budget=None))
    assert len(result.tokens) == 7 and result.stop_reason == "length"


def test_seeded_sampling_is_reproducible(tokenizer, vocab, grammar):
    model = ScriptedModel(tokenizer, [], strength=0.0, noise=3.0)
    config = GenerationConfig(sampling=SamplingConfig(temperature=1.0, seed=11),
                              max_new_tokens=20, reasoning_budget=None)
    a = run_turn(model.session(), vocab, prompt(tokenizer), config, grammar)
    b = run_turn(model.session(), vocab, prompt(tokenizer), config, grammar)
    assert a.tokens == b.tokens and a.seed == b.seed == 11
    other = GenerationConfig(sampling=SamplingConfig(temperature=1.0, seed=12),
                             max_new_tokens=20, reasoning_budget=None)
    assert run_turn(model.session(), vocab, prompt(tokenizer), other, grammar).tokens != a.tokens


def test_seeded_sampling_does_not_depend_on_chunking(tokenizer, vocab):
    """Prefilling the prompt in two pieces (a later turn, say) draws the same tokens: the draw
    for position p depends on (seed, p, logits) only."""
    model = ScriptedModel(tokenizer, [], strength=0.0, noise=3.0)
    config = GenerationConfig(sampling=SamplingConfig(temperature=1.0, seed=5),
                              max_new_tokens=15, reasoning_budget=None)
    ids = prompt(tokenizer)
    whole = run_turn(model.session(), vocab, ids, config)
    split_session = model.session()
    split_session.prefill(ids[:10], logits=False)
    split = run_turn(split_session, vocab, ids[10:], config)
    assert split.tokens == whole.tokens


def test_seeded_sampling_on_the_toy_model_ignores_chunking(tokenizer, vocab, grammar):
    import needlepoint

    model = needlepoint.load(toy_model_path())
    config = GenerationConfig(sampling=SamplingConfig(temperature=1.0, seed=9),
                              max_new_tokens=40)
    ids = prompt(tokenizer, "set an alarm for 7 and tell Ana hi")
    whole = run_turn(model.session(), vocab, ids, config, grammar)
    chunked = model.session()
    for start in range(0, len(ids) - 1, 37):
        chunked.prefill(ids[start:min(start + 37, len(ids) - 1)], logits=False)
    split = run_turn(chunked, vocab, ids[-1:], config, grammar)
    assert split.tokens == whole.tokens
    assert split.seed == whole.seed == 9


def test_call_confidence_uses_unmasked_probabilities(tokenizer, vocab, grammar):
    script = answer_ids(tokenizer, f"<tool_call>{ALARM_CALL}</tool_call><|im_end|>")
    model = ScriptedModel(tokenizer, script, head_logit=2.0)
    result = run_turn(model.session(), vocab, prompt(tokenizer), GenerationConfig(), grammar)
    call_len = len(tokenizer.encode("<tool_call>" + ALARM_CALL + "</tool_call>")) - 2
    assert len(result.call_token_probs) == call_len
    assert all(0 < p < 1 for p in result.call_token_probs)
    assert combine_confidence(2.0, result.call_token_probs) == min(
        sigmoid(2.0), min(result.call_token_probs))
    # issue 29 item 3: without a head logit, the call tokens' lowest probability alone
    assert combine_confidence(None, result.call_token_probs) == min(result.call_token_probs)


def test_conversation_reuses_the_cache(tokenizer, vocab, grammar):
    first = answer_ids(tokenizer, f"<tool_call>{ALARM_CALL}</tool_call><|im_end|>")
    second = answer_ids(tokenizer, "Done.<|im_end|>")  # each answer starts like in training
    model = ScriptedModel(tokenizer, first, second, head_logit=0.0)
    conversation = Conversation(model, vocab)
    ids = prompt(tokenizer)
    envelopes = [e for e in conversation.turn(ids, GenerationConfig(), grammar)]
    assert envelopes[-1].envelope["type"] == "call"
    follow = conversation.user_turn_ids(render_tool_results([{"name": "set_alarm",
                                                              "result": "ok"}]))
    assert follow[0] == vocab.markers.im_end  # the first turn's stop token, fed now
    done = list(conversation.turn(follow, GenerationConfig(), grammar))[-1].envelope
    assert done["type"] == "respond" and done["text"] == "Done."
    session = model.sessions[0]
    assert [p[0] for p in session.prefills] == [ids, follow]  # nothing recomputed
    # Each answer starts with the dummy-prefix space piece, as training encodes answers.
    expected_text = (render_prompt(TOOLS, "wake me at 6:45") + f" <tool_call>{ALARM_CALL}"
                     "</tool_call><|im_end|>\n<|im_start|>user\n<tool_result>"
                     '[{"name":"set_alarm","result":"ok"}]</tool_result><|im_end|>\n'
                     "<|im_start|>assistant\n Done.<|im_end|>")
    assert tokenizer.decode(conversation.ids) == expected_text
    assert model.confidence_calls[-1] == conversation.ids
    assert done["confidence"] == 0.5


def test_events_end_with_turn_complete(tokenizer, vocab):
    model = ScriptedModel(tokenizer, answer_ids(tokenizer, "Hi<|im_end|>"))
    _, events = events_of(model, vocab, GenerationConfig())
    assert isinstance(events[-1], TurnComplete)
    assert sum(isinstance(e, TurnComplete) for e in events) == 1


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_prompt_ids_match_needle2_fixtures(name):
    import ast

    tokenizer, prompts = _fixture_prompts("needle2", name, lambda p: "query" in p)
    checked = 0
    for p in prompts:
        tools = p["tools"] if isinstance(p["tools"], list) else ast.literal_eval(p["tools"])
        text = render_prompt(tools, p["query"], p.get("system") or "")
        assert text == p["text"]
        ids = p["ids"] if isinstance(p["ids"], list) else json.loads(p["ids"])
        assert prompt_ids(tokenizer, text) == ids
        checked += 1
    assert checked >= 2
