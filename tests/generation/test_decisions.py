"""The confidence of an open (template) model's answer from the decisions it made
(`generation/decisions.py`, `api/confidence.py`), on hand-computed cases.

A scripted session over the qwen2-tiny fixture's tokenizer puts logit 0 on the token the
script wants at each step, a chosen logit on a few alternatives, and -60 everywhere else (a
mass of about 1e-23 in all), so each decision's probability is known in closed form: the
chosen token against its alternatives, 1 / (1 + sum of exp(alternative logits)). Tokens the
grammar forces, and tokens with no scripted alternative, carry (about) nothing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fake_model import AnswerScript
from hf_helpers import hf_reference

from needlepoint.api.confidence import (
    CALIBRATION,
    Calibration,
    answer_evidence,
    fit_calibration,
)
from needlepoint.api.envelope import turn_envelope
from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.generation import route as route_mod
from needlepoint.generation.answer_grammar import AnswerGrammar, token_vocab, turn_vocab
from needlepoint.generation.decisions import CallCursor
from needlepoint.generation.syntaxes import syntax_for
from needlepoint.generation.turn import run_turn
from needlepoint.generation.turn_config import GenerationConfig

TOOLS = [
    {"name": "set_alarm", "description": "Set an alarm.", "parameters": {
        "type": "object", "properties": {"time": {"type": "string"}}, "required": ["time"]}},
    {"name": "call_contact", "description": "Phone a contact.", "parameters": {
        "type": "object", "properties": {"contact": {"type": "string"}},
        "required": ["contact"]}},
]
TOL = 1e-7  # the logits are float32: log(1/3) and friends are rounded


def platt(raw: float) -> float:
    """The published confidence of raw evidence, written out: the shipped Platt map
    sigmoid(slope * logit(raw) + offset) (docs/api.md)."""
    z = CALIBRATION.slope * math.log(raw / (1.0 - raw)) + CALIBRATION.offset
    return 1.0 / (1.0 + math.exp(-z))


@pytest.fixture(scope="module")
def fmt():
    tokenizer = open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer
    return TemplateFormat(tokenizer)


def encode(fmt, text: str) -> list[int]:
    return list(fmt.tokenizer.encode(text, add_special_tokens=False))


def call_answer(fmt, time: str) -> tuple[list[int], dict[str, int]]:
    """The ids of a set_alarm call answer and the steps of its name's and value's first
    tokens."""
    head = encode(fmt, '<tool_call>\n{"name": "')
    name = encode(fmt, 'set_alarm')
    middle = encode(fmt, '", "arguments": {"time": "')
    value = encode(fmt, time)
    tail = encode(fmt, '"}}\n</tool_call>')
    ids = head + name + middle + value + tail + [fmt.end_ids[0]]
    return ids, {"name": len(head), "value": len(head + name + middle)}


def decode(fmt, session, answer, alternatives, **options):
    config = GenerationConfig(max_new_tokens=len(answer) + 300, reasoning_budget=None,
                              speculate=False, require_call=options.get("require", False))
    grammar = AnswerGrammar(token_vocab(fmt), fmt, TOOLS, text=not options.get("require"),
                            require_call=options.get("require", False))
    prompt = fmt.first_ids(TOOLS, "Wake me at 6:45.")
    result = run_turn(session(answer, alternatives), turn_vocab(fmt), prompt, config,
                      content=grammar)
    assert result.tokens == answer, fmt.tokenizer.decode(result.tokens)
    return turn_envelope(result)


@pytest.fixture
def session(fmt):
    return lambda answer, alternatives: AnswerScript(len(fmt.tokenizer.all_token_bytes()),
                                                      answer, alternatives)


def test_a_call_multiplies_its_route_name_and_value_decisions(fmt, session):
    answer, at = call_answer(fmt, "06:45")
    sure, call = encode(fmt, "Sure")[0], encode(fmt, "call_contact")[0]
    seven = encode(fmt, "07")[1]  # "7": another value the string allows after "0"
    alternatives = {0: {sure: math.log(1 / 3)},  # route: call 0.75, text 0.25
                    at["name"]: {call: math.log(0.5)},  # set_alarm 2/3
                    at["value"] + 1: {seven: math.log(0.25)}}  # "6" 0.8, inside the value
    envelope = decode(fmt, session, answer, alternatives)
    assert envelope["type"] == "call" and envelope["function_calls"] == [
        {"name": "set_alarm", "arguments": {"time": "06:45"}}]
    kinds = [(d["kind"], d["call"]) for d in envelope["decisions"]]
    assert kinds[:3] == [("route", None), ("call", 0), ("call", 0)]
    probs = [d["prob"] for d in envelope["decisions"]]
    assert probs[:3] == pytest.approx([0.75, 2 / 3, 0.8], abs=TOL)
    assert all(p == pytest.approx(1.0, abs=TOL) for p in probs[3:])
    assert envelope["confidence"] == pytest.approx(platt(0.75 * 2 / 3 * 0.8), abs=TOL)
    assert envelope["call_confidences"] == pytest.approx([platt(2 / 3 * 0.8)], abs=TOL)
    assert envelope["confidence_source"] == "tokens"


def test_forced_tokens_and_a_longer_value_change_nothing(fmt, session):
    answer, at = call_answer(fmt, "06:45 on Tuesday the fourteenth of next month")
    call = encode(fmt, "call_contact")[0]
    envelope = decode(fmt, session, answer, {at["name"]: {call: math.log(0.5)}},
                      require=True)  # required: no route decision
    assert envelope["decisions"][0]["kind"] == "call"
    assert envelope["confidence"] == pytest.approx(platt(2 / 3), abs=TOL)
    assert envelope["call_confidences"] == pytest.approx([platt(2 / 3)], abs=TOL)


def test_a_text_answer_is_its_route(fmt, session):
    answer = encode(fmt, "Sure, at 6:45.") + [fmt.end_ids[0]]
    call_open = fmt.tokenizer.markers[syntax_for(fmt).open]
    envelope = decode(fmt, session, answer, {0: {call_open: math.log(1 / 9)}})  # text 0.9
    assert envelope["type"] == "respond" and envelope["function_calls"] == []
    assert [d["kind"] for d in envelope["decisions"]] == ["route"]
    assert envelope["confidence"] == pytest.approx(platt(0.9), abs=TOL)
    assert envelope["call_confidences"] == []


def test_the_evidence_and_the_calibration_hook():
    assert answer_evidence([], 0) is None and answer_evidence([], 2) == 1.0
    assert answer_evidence([{"prob": 0.5, "call": None}, {"prob": 0.5, "call": 0}], 1) == 0.25
    assert Calibration()(0.3) == 0.3 and Calibration()(None) is None
    shifted = Calibration(slope=1.0, offset=math.log(3.0))  # odds times 3
    assert shifted(0.5) == pytest.approx(0.75)
    squeezed = Calibration(slope=0.5, offset=0.0)  # odds square-rooted: 0.9 (9:1) -> 3:1
    assert squeezed(0.9) == pytest.approx(0.75) and squeezed(0.1) == pytest.approx(0.25)
    # the map's limits: certain evidence (every token forced) stays 1, none stays 0
    assert squeezed(1.0) == 1.0 and squeezed(0.0) == 0.0 and shifted(1.0) == 1.0
    raw = [0.9] * 10 + [0.2] * 10
    right = [True] * 5 + [False] * 5 + [False] * 10  # raw 0.9 is right half the time
    fitted = fit_calibration(raw, right, steps=4000, rate=0.5)
    assert fitted(0.9) == pytest.approx(0.5, abs=0.05) and fitted(0.2) < 0.1


def test_the_cursor_counts_call_objects_outside_strings():
    cursor = CallCursor()
    seen = []
    for piece in ['[', '{"name": "a', '{}[', '", "arguments": {"x": "}"}}', ', ', '{"na']:
        cursor.feed(piece)
        seen.append(cursor.call)
    assert seen == [None, 0, 0, None, None, 1]
    json.loads('[{"name": "a{}[", "arguments": {"x": "}"}}]')  # the pieces are valid JSON


# -- the call-or-answer route of tool_choice="auto" (`route.py`) ----------------------------
def test_the_model_own_choice_answers_when_text_is_its_top_token(fmt, session):
    answer = encode(fmt, "To set it, I need a time.") + [fmt.end_ids[0]]
    call_open = fmt.tokenizer.markers[syntax_for(fmt).open]
    # the marker at 9%: the old 1% rule called here; the model's own choice answers
    envelope = decode(fmt, session, answer, {0: {call_open: math.log(0.1)}})
    assert envelope["type"] == "respond" and envelope["text"].startswith("To set it")
    assert envelope["confidence"] == pytest.approx(platt(1 / 1.1), abs=TOL)


def test_a_threshold_declines_a_weak_call(fmt, session):
    text = encode(fmt, "Sure")
    answer, _ = call_answer(fmt, "06:45")
    alternatives = {0: {text[0]: math.log(2 / 3)}}  # call 0.6, text 0.4
    envelope = decode(fmt, session, answer, alternatives)
    assert envelope["type"] == "call"
    assert envelope["decisions"][0]["prob"] == pytest.approx(0.6, abs=TOL)
    config = GenerationConfig(max_new_tokens=40, reasoning_budget=None, speculate=False,
                              call_threshold=0.7)
    grammar = AnswerGrammar(token_vocab(fmt), fmt, TOOLS)
    declined = run_turn(session(answer, alternatives), turn_vocab(fmt),
                        fmt.first_ids(TOOLS, "Wake me at 6:45."), config, content=grammar)
    assert declined.call_text is None and declined.tokens[0] == text[0]
    assert declined.decisions[0].prob == pytest.approx(0.4, abs=TOL)


def test_a_fence_start_is_the_choice_to_call_in_the_template_syntax():
    # tokens: 0 "<tool_call>", 1 "```", 2 "```python", 3 "Sure", 4 "`"
    token_bytes = [b"<tool_call>", b"```", b"```python", b"Sure", b"`"]
    fence = route_mod.fence_start_mask(token_bytes)
    assert fence.tolist() == [False, True, False, False, False]
    call_start = np.array([True, False, False, False, False])
    allowed = np.ones(5, bool)
    logits = np.log(np.array([0.1, 0.5, 0.1, 0.2, 0.1]))

    def greedy(mask):
        return int(np.flatnonzero(mask)[np.argmax(logits[mask])])

    token, prob = route_mod.route(logits, allowed, call_start, fence, None, greedy)
    assert (token, prob) == (0, pytest.approx(0.6))  # "```" chosen: the marker is written
    token, prob = route_mod.route(logits, allowed, call_start, fence, 0.7, greedy)
    assert (token, prob) == (3, pytest.approx(0.4))  # declined below 0.7: the best text
    token, prob = route_mod.route(logits, allowed, call_start, None, None, greedy)
    assert (token, prob) == (1, pytest.approx(0.9))  # no fence rule: "```" is text
    only_calls = np.array([True, True, False, False, False])
    assert route_mod.route(logits, only_calls & call_start, call_start, fence, None,
                           greedy) == (0, None)  # required: no route decision


# -- no call is lost ---------------------------------------------------------------------
def test_a_repeated_call_ends_the_answer_with_the_calls_made(fmt, session):
    block, _ = call_answer(fmt, "06:45")
    block = block[:-1]  # without the end token
    other, _ = call_answer(fmt, "07:00")
    newline = encode(fmt, "\n")
    answer = block + newline + other[:-1] + newline + block + newline + block + \
        [fmt.end_ids[0]]
    config = GenerationConfig(max_new_tokens=len(answer) + 300, reasoning_budget=None,
                              speculate=False)
    result = run_turn(session(answer, {}), turn_vocab(fmt), fmt.first_ids(TOOLS, "Alarms"),
                      config, content=AnswerGrammar(token_vocab(fmt), fmt, TOOLS))
    assert result.stop_reason == "repeat"
    assert len(result.tokens) < len(answer) - len(block)  # stopped in the third block
    envelope = turn_envelope(result)
    assert envelope["type"] == "call" and envelope["function_calls"] == [
        {"name": "set_alarm", "arguments": {"time": "06:45"}},
        {"name": "set_alarm", "arguments": {"time": "07:00"}}]
    assert len(envelope["call_confidences"]) == 2


def test_a_call_list_cut_by_the_limit_keeps_its_complete_calls():
    from needlepoint.api.call_salvage import complete_calls
    from needlepoint.generation.turn_result import TurnResult

    a = {"name": "a", "arguments": {"x": "}"}}
    assert complete_calls('[{"name": "a", "arguments": {"x": "}"}}, {"name": "b", "argu') \
        == [a]
    assert complete_calls('[{"name": "a", "arguments": {"x": "}"}},{"name":"a","arguments"'
                          ':{"x":"}"}}, ') == [a]  # a repeat is left out
    assert complete_calls('[{"name": "a", "argu') == [] and complete_calls("oops") == []
    cut = TurnResult(tokens=[1, 2], reasoning="", text="", call_closed=False,
                     call_text='[{"name": "a", "arguments": {"x": "}"}}, {"name": "b", "ar',
                     stop_reason="length", call_token_probs=[], forced_call=False, seed=0,
                     prefill_tokens=1, prefill_s=0.0, decode_s=0.0, pending=[])
    envelope = turn_envelope(cut)
    assert envelope["type"] == "call" and envelope["function_calls"] == [a]
    assert "error" not in envelope and envelope["text"] == ""
    assert envelope["stop_reason"] == "length"


def test_a_text_answer_that_is_only_a_json_call_of_declared_tools():
    from needlepoint.api.call_salvage import text_calls

    call = {"name": "set_alarm", "arguments": {"time": "06:45"}}
    assert text_calls(json.dumps(call), TOOLS) == [call]
    other = {"name": "set_alarm", "arguments": {"time": "07:00"}}
    assert text_calls(f"```json\n{json.dumps([call, other, call])}\n```", TOOLS) == [
        call, other]
    assert text_calls('{"name": "hello", "arguments": {}}', TOOLS) == []  # not declared
    assert text_calls('{"name": "set_alarm", "arguments": {"time": 7}}', TOOLS) == []  # schema
    assert text_calls(f"Sure: {json.dumps(call)}", TOOLS) == []  # more than a call
