"""`needlepoint.Needle` on the bundled toy model: complete, stream, sampling, run with tool
execution, chat, extract, option validation, auto date."""

from __future__ import annotations

import json

import pydantic
import pytest
from api_helpers import EVAL, toy_tools
from conftest import toy_model_path

import needlepoint
from needlepoint.api.needle import ExtractionError, Needle
from needlepoint.generation.events import Done, ToolCallDelta
from needlepoint.models.hub import MODEL_ENV


@pytest.fixture(scope="module")
def toy():
    return needlepoint.load(toy_model_path())


# ------------------------------------------------------------------ Needle on the toy model
def test_complete_on_bundled_toy_model(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)
    tools = toy_tools()
    needle = Needle(tools=[tools["get_weather"], tools["set_timer"]])  # the bundled model
    envelope = needle.complete("can you time 50 minutes for me")
    assert envelope["type"] == "call"
    assert envelope["function_calls"] == [{"name": "set_timer", "arguments": {"minutes": 50}}]
    # issue 29 item 3: no confidence head on the toy archive, so the token measure
    assert envelope["confidence_source"] == "tokens" and 0.0 < envelope["confidence"] <= 1.0
    assert envelope["reasoning"] == "" and envelope["text"] == ""
    timings = envelope["timings"]
    for key in ("prefill_tps", "decode_tps", "prefill_tokens", "decode_tokens", "total_s"):
        assert timings[key] > 0


# Upstream's held-out score of the toy model (shared/models/README.md, "Held-out accuracy":
# upstream's JAX forward in deploy numerics, greedy): exact answers per expected call count.
UPSTREAM_EXACT = {0: (4, 41), 1: (43, 236), 2: (0, 23)}


def test_eval_examples_the_model_gets_right(toy):
    """Greedy `Needle.complete` on every held-out example gets exactly as many right, per
    expected call count, as upstream's reference decode did (47 of 300)."""
    tally = {n: [0, 0] for n in UPSTREAM_EXACT}
    for line in EVAL.read_text().splitlines():
        example = json.loads(line)
        envelope = Needle(tools=example["tools"], model=toy, reasoning_budget=None,
                          max_new_tokens=80).complete(example["query"])
        counts = tally[len(example["answers"])]
        counts[0] += envelope["function_calls"] == example["answers"]
        counts[1] += 1
    assert {n: tuple(c) for n, c in tally.items()} == UPSTREAM_EXACT


def test_stream_yields_deltas_then_done(toy):
    tools = toy_tools()
    needle = Needle(tools=[tools["set_timer"], tools["set_alarm"]], model=toy)
    events = list(needle.stream("can you time 50 minutes for me"))
    assert isinstance(events[-1], Done)
    deltas = [e.text for e in events if isinstance(e, ToolCallDelta)]
    assert len(deltas) > 3
    assert json.loads("".join(deltas)) == events[-1].envelope["function_calls"]


def test_sampling_with_seed_is_reproducible(toy):
    tools = list(toy_tools().values())[:4]
    a = Needle(tools=tools, model=toy, temperature=1.0, seed=3)
    b = Needle(tools=tools, model=toy, temperature=1.0, seed=3)
    query = "set an alarm for 7 and tell Ana hi"
    assert a.complete(query)["function_calls"] == b.complete(query)["function_calls"]
    outputs = {json.dumps(a.complete(query, seed=s)["function_calls"]) for s in range(6)}
    assert len(outputs) > 1


def test_instances_do_not_share_state(toy):
    tools = toy_tools()
    a = Needle(tools=[tools["set_timer"]], model=toy)
    b = Needle(tools=[tools["get_weather"]], model=toy)
    first = a.complete("can you time 50 minutes for me")
    b.complete("what is the weather in Paris")
    assert a.state.conversation is not b.state.conversation
    assert a.state.conversation.session is not b.state.conversation.session
    assert a.complete("can you time 50 minutes for me")["function_calls"] == \
        first["function_calls"]


def test_run_executes_and_feeds_results_back(toy):
    calls = []

    def set_timer(minutes: int, label: str = "") -> dict:
        """Start a countdown timer."""
        calls.append(minutes)
        return {"ok": True, "minutes": minutes}

    needle = Needle(tools=[set_timer], model=toy, max_rounds=3)
    assert needle.tools[0].schema() == {**toy_tools()["set_timer"]}  # same prompt as training
    envelope = needle.run("can you time 50 minutes for me")
    assert calls == [50]  # executed once, never repeated
    assert envelope["type"] == "call"
    assert envelope["results"] == [{"name": "set_timer", "arguments": {"minutes": 50},
                                    "result": {"ok": True, "minutes": 50}}]
    assert len(envelope["turns"]) >= 2
    conversation = needle.state.conversation
    text = needle.tokenizer.decode(conversation.ids)
    assert '<tool_result>[{"name":"set_timer","result":{"ok":true,"minutes":50}}]' \
           '</tool_result>' in text
    assert text.count("<tools>") == 1


def test_run_reports_tool_errors(toy):
    def set_timer(minutes: int, label: str = "") -> None:
        """Start a countdown timer."""
        raise RuntimeError("timer broken")

    envelope = Needle(tools=[set_timer], model=toy).run("can you time 50 minutes for me")
    assert envelope["results"][0]["error"] == "RuntimeError: timer broken"


def test_chat_continues_and_reset_forgets(toy):
    tools = toy_tools()
    needle = Needle(tools=[tools["set_timer"], tools["set_alarm"]], model=toy,
                    max_new_tokens=60)
    needle.chat("can you time 50 minutes for me")
    session = needle.state.conversation.session
    before = session.position
    needle.chat("and wake me at 06:45")
    assert needle.state.conversation.session is session and session.position > before
    needle.reset()
    needle.chat("can you time 50 minutes for me")
    assert needle.state.conversation.session is not session


def test_extract_dict_and_pydantic(toy):
    schema = {"type": "object", "properties": {"time": {"type": "string"}},
              "required": ["time"]}
    needle = Needle(model=toy, max_new_tokens=40)
    # The time is in the text: extraction copies it (a dict checked by the grammar, or a
    # validated pydantic instance), and the chat conversation is left alone.
    assert needle.extract("wake me up at 06:45", schema) == {"time": "06:45"}
    assert needle.extract("set an alarm for 07:30", schema) == {"time": "07:30"}

    class Alarm(pydantic.BaseModel):
        time: str

    alarm = needle.extract("wake me up at 06:45", Alarm)
    assert type(alarm) is Alarm and alarm == Alarm(time="06:45")
    assert needle.state.conversation is None


def test_extract_raises_when_declined():
    """A model stand-in whose logits prefer `[]` (the grammar allows a refusal)."""
    from fake_model import ScriptedModel

    tokenizer = needlepoint.open_archive(toy_model_path()).tokenizer
    script = tokenizer.encode("<tool_call>[]</tool_call><|im_end|>")
    needle = Needle(model=ScriptedModel(tokenizer, script, strength=40))
    with pytest.raises(ExtractionError, match="answer type refuse"):
        needle.extract("nothing", {"type": "object", "properties": {"a": {"type": "string"}}})


def test_generation_options_are_validated(toy):
    with pytest.raises(ValueError):
        Needle(model=toy, temperature=-1)
    with pytest.raises(TypeError):
        Needle(model=toy).complete("hi", temprature=1)


def test_auto_date_adds_system_fact(toy):
    needle = Needle(model=toy, auto_date=True, system={"locale": "en-US"})
    assert needle.system_text().startswith("locale: en-US; date: 20")
    assert Needle(model=toy).system_text() == ""

