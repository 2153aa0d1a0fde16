"""A confidence for every model (issue 29 item 3): the envelope's `confidence` is the head's
where the archive has one (`confidence_source` "head"), else the measure from the turn's own
token probabilities ("tokens"), on the toy archive (no head), a template model and the
Needle 3 fixture (a head). Expected values are recomputed here from the model's logits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from api_helpers import tiny_weather_turn
from conftest import REPO_ROOT, toy_model_path
from hf_helpers import hf_fixture_dir

import needlepoint
from needlepoint.api.confidence import CALIBRATION
from needlepoint.api.envelope import token_confidence, turn_confidence
from needlepoint.api.needle import Needle
from needlepoint.generation.decisions import Decision
from needlepoint.generation.turn import TurnResult

TOOLS = json.loads((REPO_ROOT / "examples" / "tools.json").read_text())


def platt(raw: float) -> float:
    """The shipped calibration written out: sigmoid(slope * logit(raw) + offset)."""
    z = CALIBRATION.slope * math.log(raw / (1.0 - raw)) + CALIBRATION.offset
    return 1.0 / (1.0 + math.exp(-z))


def turn(call_probs: list[float], decisions: list[Decision]) -> TurnResult:
    return TurnResult(tokens=[1], reasoning="", text="", call_text=None, call_closed=False,
                      stop_reason="end", call_token_probs=call_probs, forced_call=False,
                      seed=0, prefill_tokens=1, prefill_s=0.0, decode_s=0.0, pending=[],
                      decisions=decisions)


def test_the_measure_is_the_product_of_the_decisions_else_the_head():
    made = [Decision("route", None, 0.8), Decision("call", 0, 0.5), Decision("call", 1, 0.9)]
    assert abs(token_confidence(turn([], made), 2) - platt(0.36)) < 1e-12
    assert token_confidence(turn([], []), 0) is None  # nothing decided: a text-only turn
    assert token_confidence(turn([], []), 1) == 1.0  # a call the grammar forced whole
    head = 1.0 / (1.0 + math.exp(1.0))  # sigmoid(-1), below every token probability
    assert turn_confidence(turn([0.9, 0.4, 0.8], made), -1.0) == (head, "head")
    assert turn_confidence(turn([0.9, 0.4, 0.8], made), 3.0) == (0.4, "head")
    assert turn_confidence(turn([0.9, 0.4, 0.8], made), None, 2)[1] == "tokens"
    assert turn_confidence(turn([], []), None) == (None, None)


def replayed_probs(model, prompt: list[int], answer: list[int]) -> list[float]:
    """The unmasked probability (softmax at temperature 1, float64) of each answer token,
    from a fresh session fed the prompt and then the answer token by token."""
    session = model.session()
    logits = session.prefill(prompt, logits=True)
    probs = []
    for k, token in enumerate(answer):
        x = np.asarray(logits, np.float64).reshape(-1)
        e = np.exp(x - x.max())
        probs.append(float(e[token] / e.sum()))
        if k + 1 < len(answer):
            logits = session.step(token)
    return probs


def call_probs(model, prompt: list[int], answer: list[int]) -> list[float]:
    """The probabilities of the tokens the model chose inside the call: after `<tool_call>`
    through `</tool_call>` (to the end of the answer when the call was cut)."""
    tokenizer = model.tokenizer
    open_id, close_id = (tokenizer.marker_id(m) for m in ("<tool_call>", "</tool_call>"))
    start = answer.index(open_id) + 1
    end = answer.index(close_id) + 1 if close_id in answer else len(answer)
    return replayed_probs(model, prompt, answer)[start:end]


def test_a_model_without_a_head_reports_the_token_measure():
    model = needlepoint.load(toy_model_path())
    assert not model.capabilities.confidence_head
    needle = Needle(tools=TOOLS, model=model)
    query = "wake me up at 06:45"
    call = needle.complete(query)
    answer = needle.state.conversation.last_answer
    assert call["type"] == "call" and call["confidence_source"] == "tokens"
    made = call["decisions"]
    assert made and all(0.0 < d["prob"] <= 1.0 for d in made)
    assert abs(call["confidence"] - platt(math.prod(d["prob"] for d in made))) < 1e-12
    own = [d["prob"] for d in made if d["call"] == 0]
    assert call["call_confidences"] == [pytest.approx(platt(math.prod(own)), abs=1e-12)]
    assert len(answer) > len(made)  # forced tokens are no decisions

    text = needle.complete("hello", allow_call=False, max_new_tokens=4)
    assert text["type"] == "respond" and text["decisions"] == []
    assert (text["confidence"], text["confidence_source"]) == (None, None)  # nothing decided

    ran = needle.run(query)  # the summary: the lowest over the turns, with its source
    assert ran["confidence"] == min(t["confidence"] for t in ran["turns"])
    assert ran["confidence_source"] == "tokens"


def test_the_token_measure_has_the_same_bits_at_any_batch():
    needle = Needle(tools=TOOLS, model=needlepoint.load(toy_model_path()), cache=None)
    queries = ["wake me up at 06:45", "what's the weather in Paris", "hello there",
               "set a timer for 5 minutes"]
    alone = [needle.complete(q, max_new_tokens=24) for q in queries]
    together = needle.complete_many(queries, max_new_tokens=24, max_sessions=4)
    for a, b in zip(alone, together, strict=True):
        assert a["confidence_source"] == b["confidence_source"] == "tokens"
        assert a["confidence"] == b["confidence"]  # same bits, not approximately
        assert 0.0 <= b["confidence"] <= 1.0


def test_a_model_with_a_head_reports_the_head():
    model, needle, envelope = tiny_weather_turn()
    assert model.capabilities.confidence_head
    conversation = needle.state.conversation
    head = conversation.confidence_logit()[0]  # the pooled head over the conversation
    assert envelope["confidence_source"] == "head"
    answer = conversation.last_answer
    measures = [1.0 / (1.0 + math.exp(-head)),
                *call_probs(model, needle.prompt_ids("weather in Lagos?"), answer)]
    assert abs(envelope["confidence"] - min(measures)) < 1e-9
    assert 0.0 <= envelope["confidence"] <= 1.0


def test_a_template_model_has_a_confidence():
    needle = Needle(tools=TOOLS, model=hf_fixture_dir("llama-tiny"), max_new_tokens=8)
    assert needle.whole_answer  # a chat-template model, not Needle's wire format
    envelope = needle.complete("wake me up at 06:45")
    assert envelope["confidence_source"] == "tokens" and 0.0 < envelope["confidence"] <= 1.0
