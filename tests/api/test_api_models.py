"""`needlepoint.Needle` beyond the toy model: the confidence head on a fixture, model
resolution and the model cache, and a Needle 2 model through the same API."""

from __future__ import annotations

import threading

import jsonschema
import numpy as np
import pytest
from api_helpers import tiny_weather_turn
from conftest import get_fixture, toy_model_path

import needlepoint
from needlepoint.api.needle import Needle
from needlepoint.models.hub import (
    MODEL_ENV,
    ModelCache,
    ModelNotFoundError,
    bundled_model_path,
    resolve_model_path,
)


# ------------------------------------------------------------------ confidence
def test_confidence_matches_the_head_on_a_fixture():
    """The tiny fixture has a confidence head: the envelope's confidence is min(sigmoid(head
    over the whole turn), lowest in-call token probability), and the head logit equals the
    model's full recomputation; with float numerics it matches upstream's reference."""
    fixture = get_fixture("needle3", "tiny")
    model, needle, envelope = tiny_weather_turn()
    conversation = needle.state.conversation
    head = model.confidence_logit(conversation.ids)
    assert head is not None
    assert conversation.confidence_logit()[0] == pytest.approx(head, abs=1e-4)
    assert envelope["confidence"] <= 1 / (1 + np.exp(-head)) + 1e-6
    assert 0 < envelope["confidence"] <= 1

    float_model = needlepoint.load(fixture.cact, numerics="float")
    names = list(fixture.arrays["prompt_names"])
    i = names.index("tool_query")
    ids = list(fixture.arrays[f"p{i}_tokens"]) + list(fixture.arrays[f"p{i}_greedy_float"])
    expected = float(fixture.arrays[f"p{i}_with_greedy_conf_logit_float"])
    assert float_model.confidence_logit(ids) == pytest.approx(expected, abs=2e-3)


# ------------------------------------------------------------------ model resolution
def test_model_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv(MODEL_ENV, raising=False)
    bundled = bundled_model_path()
    assert bundled.name == "needle3-toy.cact"
    assert bundled.read_bytes() == toy_model_path().read_bytes()
    assert resolve_model_path(None) == bundled
    tiny = get_fixture("needle3", "tiny").cact
    monkeypatch.setenv(MODEL_ENV, str(tiny))
    assert resolve_model_path(None) == tiny
    assert resolve_model_path(toy_model_path()) == toy_model_path()
    monkeypatch.setenv(MODEL_ENV, str(tmp_path / "missing.cact"))
    with pytest.raises(ModelNotFoundError, match=MODEL_ENV):
        resolve_model_path(None)
    with pytest.raises(ModelNotFoundError):
        Needle(model=tmp_path / "nope.cact")


def test_model_cache_loads_once_across_threads():
    loads = []

    def loader(path):
        loads.append(path)
        return object()

    cache = ModelCache(loader)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.load(toy_model_path())))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len({id(r) for r in results}) == 1


def test_needle2_model_through_the_same_api():
    model = needlepoint.load(get_fixture("needle2", "tiny").cact)
    # Bounded arguments: random weights would otherwise fill a string up to max_new_tokens.
    door = {"name": "lock_door", "description": "Lock a door.", "parameters": {
        "type": "object", "properties": {"door": {"type": "string", "enum": ["front", "back"]},
                                         "note": {"type": "string", "maxLength": 2}}}}
    for seed in range(3):
        needle = Needle(tools=[door], model=model, temperature=1.0, seed=seed,
                        reasoning_budget=0, max_new_tokens=60)
        free = needle.complete("lock the front door")  # a call or a refusal, never text
        assert free["type"] in ("call", "refuse") and free["stop_reason"] == "end"
        forced = needle.complete("lock the front door", require_call=True)
        assert forced["type"] == "call" and forced["stop_reason"] == "end"
        for envelope in (free, forced):
            assert len(envelope["function_calls"]) == int(envelope["type"] == "call")
            for call in envelope["function_calls"]:  # one tool: at most one call
                assert call["name"] == "lock_door"
                jsonschema.validate(call["arguments"],
                                    {**door["parameters"], "additionalProperties": False})
            assert 0.0 <= envelope["confidence"] <= 1.0  # the Needle 2 fixture has a head
