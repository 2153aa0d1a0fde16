"""What the generation and API tests share: the toy model's alarm and weather tool schemas,
and the toy tokenizer with its two vocabularies as module-scoped fixtures (request them by
name: `tokenizer`, `vocab` (the turn's), `grammar_vocab` (the tool-call grammar's))."""

from __future__ import annotations

import pytest
from conftest import toy_model_path

from needlepoint import open_archive
from needlepoint.generation.grammar import TokenVocab
from needlepoint.generation.turn import TurnVocab

ALARM = {"name": "set_alarm", "description": "Set an alarm at a time of day.",
         "parameters": {"type": "object", "properties": {"time": {"type": "string"},
                                                         "label": {"type": "string"}},
                        "required": ["time"]}}
WEATHER = {"name": "get_weather", "description": "Get the weather forecast for a city.",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string"},
                                         "day": {"type": "string", "enum": ["today", "tomorrow"]}},
                          "required": ["city"]}}
# The same tool with the city as its only argument.
CITY_WEATHER = {"name": "get_weather", "description": "Get the weather forecast for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}


@pytest.fixture(scope="module", name="tokenizer")
def toy_tokenizer():
    return open_archive(toy_model_path()).tokenizer


@pytest.fixture(scope="module", name="vocab")
def toy_turn_vocab(tokenizer):
    return TurnVocab.from_tokenizer(tokenizer)


@pytest.fixture(scope="module", name="grammar_vocab")
def toy_grammar_vocab(tokenizer):
    return TokenVocab.from_tokenizer(tokenizer)
