"""`Needle` per-call options and the defects a new user hit: a required call never answers
`[]`, `parallel_tool_calls=False` gives at most one call, `response_format` JSON, stop and
logprobs; blank / non-string queries; no tools; the grammar off validates calls; long chats
drop their oldest turns; corrupt weights raise a typed error; one seed rule."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from api_helpers import EVAL, toy_tools
from conftest import toy_model_path
from corrupt_helpers import corrupt_copy
from fake_model import ScriptedModel, answer_ids

import needlepoint
from needlepoint.api.needle import NO_TOOLS_NOTE, Needle
from needlepoint.errors import InvalidOptionError, InvalidQueryError, NonFiniteActivationError

TOOLS = json.loads((Path(__file__).resolve().parents[2] / "examples" / "tools.json").read_text())


@pytest.fixture(scope="module")
def toy():
    return needlepoint.load(toy_model_path())


@pytest.fixture(scope="module")
def tokenizer():
    return needlepoint.open_archive(toy_model_path()).tokenizer


# ------------------------------------------------------------------ call count
def test_require_call_never_refuses(toy):
    needle = Needle(tools=TOOLS, model=toy)
    assert needle.complete("tell me a joke")["type"] == "refuse"  # the model's own answer
    forced = needle.complete("tell me a joke", require_call=True)
    assert forced["type"] == "call" and len(forced["function_calls"]) >= 1
    assert {c["name"] for c in forced["function_calls"]} <= {t["name"] for t in TOOLS}


def test_parallel_tool_calls_false_gives_at_most_one_call(toy):
    two = [json.loads(line) for line in EVAL.read_text().splitlines()]
    two = [e for e in two if len(e["answers"]) == 2][:6]
    checked = 0
    for example in two:
        needle = Needle(tools=example["tools"], model=toy)
        if len(needle.complete(example["query"])["function_calls"]) < 2:
            continue
        single = needle.complete(example["query"], parallel_tool_calls=False)
        assert single["type"] == "call" and len(single["function_calls"]) == 1
        checked += 1
    assert checked >= 1  # at least one example where the model itself made two calls
    with pytest.raises(InvalidOptionError, match="parallel_tool_calls"):
        Needle(tools=TOOLS, model=toy).complete("hi", parallel_tool_calls="no")


# ------------------------------------------------------------------ response_format
def test_response_format_json_schema(toy):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "ok": {"type": "boolean"}},
              "required": ["city", "ok"], "additionalProperties": False}
    needle = Needle(model=toy)
    for fmt in (schema, {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}):
        envelope = needle.complete("what is the weather in Paris", response_format=fmt,
                                   allow_call=False, max_new_tokens=60)
        assert envelope["type"] == "respond" and envelope["stop_reason"] == "end"
        jsonschema.validate(json.loads(envelope["text"]), schema)
    obj = needle.complete("play some jazz", response_format={"type": "json_object"},
                          max_new_tokens=60)
    assert obj["stop_reason"] == "end" and isinstance(json.loads(obj["text"]), dict)
    with pytest.raises(InvalidOptionError, match="response_format"):
        needle.complete("hi", response_format=42)


def test_stop_and_logprobs_through_needle(toy):
    needle = Needle(model=toy, max_new_tokens=30)
    free = needle.complete("hello", allow_call=False)
    assert free["type"] == "respond" and len(free["text"]) > 10
    stop = free["text"][6:9]
    cut = needle.complete("hello", allow_call=False, stop=[stop])
    assert cut["stop_reason"] == "stop"
    assert cut["text"] == free["text"][: free["text"].index(stop)].rstrip()
    scored = needle.complete("hello", allow_call=False, logprobs=2)
    assert scored["text"] == free["text"]
    assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 for e in scored["logprobs"])


# ------------------------------------------------------------------ queries
@pytest.mark.parametrize("query", ["", "   \n", None, 42, b"wake me"])
def test_bad_queries_are_a_clear_value_error(toy, query):
    needle = Needle(tools=TOOLS, model=toy)
    for call in (needle.complete, needle.chat, lambda q: list(needle.stream(q)),
                 lambda q: needle.extract(q, {"type": "object"}), needle.prompt_ids):
        with pytest.raises(InvalidQueryError) as err:
            call(query)
        assert isinstance(err.value, ValueError)
        assert "query" in str(err.value)


# ------------------------------------------------------------------ no tools
def test_no_tools_refuses_at_once_and_says_so(toy):
    needle = Needle(model=toy)
    envelope = needle.complete("send a message to Ana saying hi")
    assert envelope["type"] == "refuse" and envelope["note"] == NO_TOOLS_NOTE
    # `▁<tool_call>[]</tool_call><|im_end|>` and nothing else (it used to be 260 tokens).
    assert envelope["timings"]["decode_tokens"] <= 5 and envelope["text"] == ""
    text = needle.complete("hello", allow_call=False, max_new_tokens=20)
    assert text["type"] == "respond" and "note" not in text
    with pytest.raises(InvalidOptionError, match="at least one tool"):
        Needle(model=toy, grammar=False).complete("hi", require_call=True)


# ------------------------------------------------------------------ grammar off
def test_grammar_off_reports_invalid_calls(tokenizer):
    tools = [toy_tools()["set_alarm"]]
    cases = {
        '[{"name":"launch_rocket","arguments":{}}]': "not a declared tool",
        '[{"name":"set_alarm","arguments":{"time":5}}]': "time",
        '[{"name":"set_alarm","arguments":{"time":"7","color":"red"}}]': "Additional",
    }
    for call, problem in cases.items():
        script = answer_ids(tokenizer, f"<tool_call>{call}</tool_call><|im_end|>")
        needle = Needle(tools=tools, model=ScriptedModel(tokenizer, script, strength=40),
                        grammar=False, reasoning_budget=None)
        envelope = needle.complete("wake me up")
        assert envelope["type"] == "invalid", call
        assert problem in envelope["error"]
        assert envelope["function_calls"] == json.loads(call)  # reported as written
    good = '[{"name":"set_alarm","arguments":{"time":"06:45"}}]'
    script = answer_ids(tokenizer, f"<tool_call>{good}</tool_call><|im_end|>")
    needle = Needle(tools=tools, model=ScriptedModel(tokenizer, script, strength=40),
                    grammar=False, reasoning_budget=None)
    assert needle.complete("wake me up")["type"] == "call"


def test_run_never_executes_an_invalid_call(tokenizer):
    ran = []

    def set_alarm(time: str) -> str:
        ran.append(time)
        return "ok"

    script = answer_ids(tokenizer, '<tool_call>[{"name":"set_alarm","arguments":{"time":1}}]'
                                   "</tool_call><|im_end|>")
    needle = Needle(tools=[set_alarm], model=ScriptedModel(tokenizer, script, strength=40),
                    grammar=False, reasoning_budget=None)
    assert needle.run("wake me")["type"] == "invalid" and ran == []


# ------------------------------------------------------------------ long chats
def test_chat_drops_the_oldest_turns_when_full(tokenizer):
    answer = answer_ids(tokenizer, "Done, all set for you.<|im_end|>")
    model = ScriptedModel(tokenizer, answer, strength=40, max_seq_len=320)
    needle = Needle(tools=[toy_tools()["set_alarm"]], model=model, max_new_tokens=24)
    dropped = []
    for k in range(14):
        envelope = needle.chat(f"please note item number {k} for me")
        assert envelope["type"] == "respond" and envelope["text"] == "Done, all set for you."
        dropped.append(envelope.get("dropped_turns", 0))
        conversation = needle.state.conversation
        assert conversation.position <= 320
    assert any(dropped) and dropped[0] == 0
    text = tokenizer.decode(needle.state.conversation.ids)
    assert text.count("<tools>") == 1 and "item number 13" in text  # latest kept, tools shown
    assert "item number 0 " not in text  # the oldest is gone
    assert needle.state.conversation.ids[0] == tokenizer.bos_id


# ------------------------------------------------------------------ corrupt weights
def test_corrupt_weights_raise_non_finite_activation_error(tmp_path):
    path = corrupt_copy(tmp_path, "layer01.w1b")
    needle = Needle(tools=TOOLS, model=str(path), cache=None)
    with pytest.raises(NonFiniteActivationError, match="non-finite"):
        needle.complete("wake me up at 06:45")
    assert issubclass(NonFiniteActivationError, needlepoint.NeedlepointError)


# ------------------------------------------------------------------ seeds and options
def test_one_seed_rule_for_the_api(toy):
    needle = Needle(tools=TOOLS, model=toy, temperature=1.0)
    for seed in (-5, -(2**63), 2**63 - 1):
        assert needle.complete("hello", seed=seed)["seed"] == seed
    for seed in (2**63, -(2**63) - 1):
        with pytest.raises(InvalidOptionError, match="seed"):
            needle.complete("hello", seed=seed)
    free = Needle(model=toy, temperature=1.5, max_new_tokens=30)
    texts = {free.complete("hello", allow_call=False, seed=s)["text"] for s in (-5, -6, -1000)}
    assert len(texts) == 3  # distinct negative seeds are distinct streams
    assert free.complete("hello", allow_call=False, seed=-5)["text"] in texts


def test_option_errors_name_the_option(toy):
    for kwargs, name in (({"temperature": "hot"}, "temperature"),
                         ({"temperature": float("nan")}, "temperature"),
                         ({"top_p": 5}, "top_p"), ({"max_new_tokens": 0}, "max_new_tokens"),
                         ({"reasoning_budget": -1}, "reasoning_budget")):
        with pytest.raises(InvalidOptionError, match=name) as err:
            Needle(model=toy, **kwargs)
        assert "must be" in str(err.value)
