"""A confidence for every model (issue 29 item 3): `token_confidence` beside the head's
`confidence` (`api/envelope.py`), on the toy archive (no head) and a template model."""

from __future__ import annotations

import json

from conftest import REPO_ROOT, toy_model_path
from hf_helpers import hf_fixture_dir

from needlepoint.api.envelope import answer_confidence, token_confidence
from needlepoint.api.needle import Needle
from needlepoint.generation.turn import TurnResult

TOOLS = json.loads((REPO_ROOT / "examples" / "tools.json").read_text())


def turn(call_probs: list[float], first: float | None) -> TurnResult:
    return TurnResult(tokens=[1], reasoning="", text="", call_text=None, call_closed=False,
                      stop_reason="end", call_token_probs=call_probs, forced_call=False,
                      seed=0, prefill_tokens=1, prefill_s=0.0, decode_s=0.0, pending=[],
                      first_token_prob=first)


def test_the_measure_is_the_calls_lowest_token_else_the_first_token():
    assert token_confidence(turn([0.9, 0.4, 0.8], 0.99)) == 0.4
    assert token_confidence(turn([], 0.75)) == 0.75
    assert token_confidence(turn([], None)) is None
    assert answer_confidence({"confidence": 0.3, "token_confidence": 0.9}) == 0.3
    assert answer_confidence({"confidence": None, "token_confidence": 0.9}) == 0.9


def test_the_toy_archive_has_a_confidence_without_a_head():
    needle = Needle(tools=TOOLS, model=toy_model_path())
    call = needle.complete("wake me up at 06:45")
    assert call["type"] == "call" and call["confidence"] is None
    assert 0.0 < call["token_confidence"] <= 1.0
    text = needle.complete("hello", allow_call=False, max_new_tokens=4)
    assert text["type"] == "respond" and 0.0 < text["token_confidence"] <= 1.0
    ran = needle.run("wake me up at 06:45")  # the summary: the lowest over the turns
    assert ran["token_confidence"] == min(t["token_confidence"] for t in ran["turns"])


def test_a_template_model_has_a_confidence():
    needle = Needle(tools=TOOLS, model=hf_fixture_dir("llama-tiny"), max_new_tokens=8)
    assert needle.whole_answer  # a chat-template model, not Needle's wire format
    envelope = needle.complete("wake me up at 06:45")
    assert envelope["confidence"] is None and 0.0 < envelope["token_confidence"] <= 1.0


