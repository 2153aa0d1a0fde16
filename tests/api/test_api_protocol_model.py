"""A model written only against `models/protocol.py` runs through everything above the models
(issue 27 item 3): `Needle` (complete, chat, the confidence head over the whole
conversation), the continuous-batching scheduler (`complete_many`) and the HTTP server.

The model is `fake_model.ScriptedModel`: the protocol's core (`session`, `prefill`, `step`,
`check_ids`, `confidence_logit`, `config.max_seq_len`, `chat_format`) and capabilities
that declare nothing optional but the confidence head. It has no `extend`, `rewind`, `fork`
or `run_batch` at all, so a caller that probed for them instead of reading the declared
capabilities would fail here."""

from __future__ import annotations

import json

import pytest
from conftest import toy_model_path
from fake_model import ScriptedModel, answer_ids
from fastapi.testclient import TestClient

import needlepoint
from needlepoint.api.needle import Needle
from needlepoint.api.scheduler import Scheduler
from needlepoint.models.protocol import ModelProtocol, SessionProtocol
from needlepoint.server import create_app

CALL = '[{"name":"set_alarm","arguments":{"time":"06:45"}}]'
TOOL = {"name": "set_alarm", "description": "Set an alarm at a time of day.",
        "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                       "required": ["time"]}}
OPTIONAL = ("extend", "rewind", "fork", "run_batch", "embed", "chunk",
            "has_confidence_head", "has_contrastive_head", "pipeline_depth")


@pytest.fixture(scope="module")
def tokenizer():
    return needlepoint.open_archive(toy_model_path()).tokenizer


def scripted(tokenizer, head_logit: float | None = 1.5) -> ScriptedModel:
    script = answer_ids(tokenizer, f"<tool_call>{CALL}</tool_call><|im_end|>")
    return ScriptedModel(tokenizer, script, strength=40, max_seq_len=2048,
                         head_logit=head_logit)


def test_the_fake_is_the_protocol_and_nothing_more(tokenizer):
    model = scripted(tokenizer)
    session = model.session()
    assert isinstance(model, ModelProtocol) and isinstance(session, SessionProtocol)
    assert not any(hasattr(model, name) or hasattr(session, name) for name in OPTIONAL)
    caps = session.capabilities
    assert not (caps.extend or caps.rewind or caps.exact or caps.fork or caps.confidence)
    assert model.capabilities.confidence_head and not model.capabilities.run_batch


def test_needle_runs_on_the_protocol_alone(tokenizer):
    model = scripted(tokenizer)
    needle = Needle(tools=[TOOL], model=model, cache=None)
    envelope = needle.complete("wake me at 6:45")
    assert envelope["type"] == "call"
    assert envelope["function_calls"] == json.loads(CALL)
    # no pooled head on the session: the model's head ran over prompt + answer (EOS-free)
    session = model.sessions[-1]
    assert model.confidence_calls == [session.ids + [tokenizer.marker_id("<|im_end|>")]]
    assert envelope["confidence"] is not None and 0 < envelope["confidence"] <= 1
    second = needle.chat("and one at 7")
    assert second["function_calls"] == json.loads(CALL)
    # the next turn's prefill starts with the unfed `<|im_end|>` (no rewind needed)
    assert session.prefills[1][0][0] == tokenizer.marker_id("<|im_end|>")
    assert len(model.sessions) == 1  # one conversation, one session


def test_no_head_logit_means_the_token_confidence(tokenizer):
    model = scripted(tokenizer, head_logit=None)
    envelope = Needle(tools=[TOOL], model=model, cache=None).complete("wake me at 6:45")
    assert len(model.confidence_calls) == 1
    # issue 29 item 3: no head logit, so the token measure (in [0, 1]) and its source
    assert envelope["confidence_source"] == "tokens" and 0.0 < envelope["confidence"] <= 1.0


def test_complete_many_through_the_scheduler(tokenizer):
    model = scripted(tokenizer)
    with pytest.raises(ValueError, match="run_batch"):
        Scheduler(model, batched=True)  # not declared: the scheduler will not batch it
    scheduler = Scheduler(model, max_sessions=3)
    try:
        assert scheduler.batched is False and scheduler.loops == 1
        queries = ["wake me at 6:45", "alarm for 6:45 please", "6:45 alarm"]
        needle = Needle(tools=[TOOL], model=model, cache=None)
        many = needle.complete_many(queries, scheduler=scheduler)
        stats = scheduler.stats()
    finally:
        scheduler.close()
    alone = [Needle(tools=[TOOL], model=scripted(tokenizer), cache=None).complete(q)
             for q in queries]
    for got, want in zip(many, alone, strict=True):
        assert got["function_calls"] == want["function_calls"] == json.loads(CALL)
        assert got["type"] == want["type"] and got["confidence"] == want["confidence"]
    assert stats["leases"] == len(queries) and stats["steps"] > 0


@pytest.mark.parametrize("batching", [True, False])
def test_the_server_serves_it(tokenizer, batching):
    model = scripted(tokenizer)
    app = create_app(model, workers=2, batching=batching)
    body = {"model": "scripted", "messages": [{"role": "user", "content": "wake me at 6:45"}],
            "tools": [{"type": "function", "function": TOOL}]}
    with TestClient(app) as client:
        card = client.get("/v1/models").json()["data"][0]
        assert card["id"] == "scripted" and card["context_length"] == 2048
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"] == "set_alarm" and json.loads(call["arguments"]) == {"time": "06:45"}
        health = client.get("/health").json()
        assert health["batching"] is batching
        if batching:
            assert health["scheduler"]["steps"] > 0 and health["scheduler"]["batched"] is False


# model and session attributes (`fork` is left out: a grammar matcher's own `fork` is
# generation's matcher interface, `drafts.py`)
PROBED = frozenset({"extend", "rewind", "confidence_logit", "run_batch", "embed",
                    "pipeline_depth", "chunk", "has_confidence_head",
                    "has_contrastive_head", "config", "cfg", "model", "max_seq_len",
                    "context_length", "check_ids", "chat_format", "archive"})


def test_no_layer_above_the_models_probes_for_them():
    """`api/`, `generation/` and `server/` read `capabilities` (issue 27 item 3): no
    `getattr` / `hasattr` of a model or session attribute is left to creep back."""
    import ast
    from pathlib import Path

    root = Path(needlepoint.__file__).parent
    found = []
    for folder in ("api", "generation", "server"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 and \
                        isinstance(node.args[1], ast.Constant) and node.args[1].value in PROBED:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.args[1].value}")
    assert found == []
