"""Property: with the grammar on, every sampled tool call parses, validates against its schema,
names only declared tools and repeats none, whatever the tools and the weights.

Schemas are generated (seeded) over the JSON-schema features tool definitions use; the models
are the random-weight `tiny` fixture and the trained toy model, sampled at temperature 1 with
a different seed per case. The call is forced right away (reasoning budget 0) so every case
exercises the constrained phase. Strings, arrays and integers carry bounds (fractional numbers
are enumerated) so a sampled call always fits in `MAX_NEW_TOKENS`.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from conftest import get_fixture, toy_model_path

import needlepoint
from needlepoint.api.conversation import Conversation
from needlepoint.formats.needle_wire import prompt_ids, render_prompt
from needlepoint.generation.grammar import TokenVocab, ToolCallGrammar
from needlepoint.generation.sampling import SamplingConfig
from needlepoint.generation.turn import GenerationConfig, TurnVocab

CASES_PER_MODEL = 120  # x 2 models = 240 tool sets
MAX_NEW_TOKENS = 160
WORDS = ["city", "room", "time", "label", "count", "mode", "level", "note", "tags", "when",
         "user", "item", "target", "speed", "color", "size", "flag", "units", "query", "id"]
NAMES = ["get_weather", "set_alarm", "send_message", "play_music", "lock_door", "navigate",
         "add_item", "book_table", "search", "convert", "translate", "schedule"]


def _string(rng: random.Random) -> dict:
    schema = {"type": "string", "maxLength": rng.randint(1, 10)}
    if rng.random() < 0.3:
        schema["minLength"] = 1
    return schema


def _leaf(rng: random.Random) -> dict:
    kind = rng.choice(["string", "string", "integer", "number", "boolean", "enum", "enum_int"])
    if kind == "string":
        return _string(rng)
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "number":  # an unbounded fraction could outrun MAX_NEW_TOKENS: enumerate
        return {"type": "number", "enum": [0.5, -2.25, 10]}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        words = rng.sample(WORDS, rng.randint(1, 4))
        return {"type": "string", "enum": words}
    return {"type": "integer", "enum": rng.sample(range(-5, 100), rng.randint(1, 4))}


def _value(rng: random.Random, depth: int) -> dict:
    roll = rng.random()
    if depth < 1 and roll < 0.12:
        return {"type": "array", "items": _leaf(rng), "maxItems": rng.randint(0, 3)}
    if depth < 1 and roll < 0.2:
        return _object(rng, depth + 1, max_props=2)
    return _leaf(rng)


def _object(rng: random.Random, depth: int, max_props: int = 3) -> dict:
    names = rng.sample(WORDS, rng.randint(0, max_props))
    schema = {"type": "object", "properties": {n: _value(rng, depth) for n in names}}
    required = [n for n in names if rng.random() < 0.6]
    if required or rng.random() < 0.5:
        schema["required"] = required
    return schema


def random_tools(rng: random.Random) -> list[dict]:
    names = rng.sample(NAMES, rng.randint(1, 4))
    return [{"name": name, "description": f"Tool {name.replace('_', ' ')}.",
             "parameters": _object(rng, 0)} for name in names]


def check_calls(calls: list[dict], tools: list[dict]) -> None:
    by_name = {tool["name"]: tool for tool in tools}
    names = [call["name"] for call in calls]
    assert len(names) == len(set(names)), f"repeated tool in {names}"
    for call in calls:
        assert call["name"] in by_name, f"undeclared tool {call['name']!r}"
        jsonschema.validate(call["arguments"], by_name[call["name"]]["parameters"])
        assert list(call["arguments"]) == [k for k in by_name[call["name"]]["parameters"]
                                          ["properties"] if k in call["arguments"]]


def _models():
    return {"tiny": get_fixture("needle3", "tiny").cact, "toy": toy_model_path()}


@pytest.mark.parametrize("name", ["tiny", "toy"])
def test_sampled_calls_always_validate(name):
    model = needlepoint.load(_models()[name])
    tokenizer = model.tokenizer
    vocab = TurnVocab.from_tokenizer(tokenizer)
    grammar_vocab = TokenVocab.from_tokenizer(tokenizer)
    rng = random.Random(f"toolcall-property-{name}")
    kinds = {"call": 0, "refuse": 0}
    for case in range(CASES_PER_MODEL):
        tools = random_tools(rng)
        query = rng.choice(["please help", "wake me at 7", "weather in Oslo?", "do the thing"])
        config = GenerationConfig(
            sampling=SamplingConfig(temperature=1.0, seed=case), max_new_tokens=MAX_NEW_TOKENS,
            reasoning_budget=0)
        conversation = Conversation(model, vocab)
        ids = prompt_ids(tokenizer, render_prompt(tools, query))
        grammar = ToolCallGrammar(grammar_vocab, tools)
        envelope = [e for e in conversation.turn(ids, config, grammar)][-1].envelope
        where = f"{name} case {case}: {json.dumps(tools)} -> {envelope.get('text')!r}"
        assert envelope["stop_reason"] == "end", where
        assert envelope["type"] in kinds, where
        kinds[envelope["type"]] += 1
        check_calls(envelope["function_calls"], tools)
    assert kinds["call"] > CASES_PER_MODEL // 4  # not just refusals
