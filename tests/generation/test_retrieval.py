"""Tool retrieval with the Needle 2 contrastive head (`needlepoint.retrieval`, `Needle`).

The fixtures have random weights, so which tools rank first is arbitrary: the tests pin the
mechanics against an independent computation (the scores are `model.embed` dot products of
the documented texts, the ranking sorts them, the offered subset is what the prompt and the
grammar see), and `model.embed` itself against the reference arrays.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import get_fixture

import needlepoint
from needlepoint import NeedlepointError, ToolSchemaError
from needlepoint.api.needle import Needle, RetrievalUnavailableError
from needlepoint.formats.needle_wire import continuation_ids
from needlepoint.generation.grammar import MAX_TOOLS, GrammarError
from needlepoint.generation.retrieval import (
    DEFAULT_RETRIEVE_K,
    DEFAULT_RETRIEVE_THRESHOLD,
    ToolIndex,
    rank,
    top_k,
)

NEEDLE2 = ("tiny", "small")
# tiny's context is 256 tokens: 2 tools (~130 prompt tokens) leave room for the call.
K_FOR = {"tiny": 2, "small": DEFAULT_RETRIEVE_K}
QUERY = "lock the front door"


def enum_tool(name: str, description: str, param: str, values: list[str]) -> dict:
    # Enum-only arguments keep random-weight calls short (a free string could run long).
    return {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {param: {"type": "string", "enum": values}},
        "required": [param]}}


TOOLS = [
    enum_tool("set_light", "Turn a light on or off.", "state", ["on", "off"]),
    enum_tool("get_weather", "Weather for a city.", "city", ["Oslo", "Lima"]),
    enum_tool("set_timer", "Start a timer.", "minutes", ["5", "10"]),
    enum_tool("play_music", "Play a song.", "genre", ["jazz", "rock"]),
    enum_tool("lock_door", "Lock a door.", "door", ["front", "back"]),
    enum_tool("send_text", "Text a contact.", "to", ["Ana", "Bo"]),
    enum_tool("add_todo", "Add a to-do item.", "item", ["milk", "eggs"]),
    enum_tool("set_alarm", "Set an alarm.", "time", ["06:45", "07:00"]),
    enum_tool("call_taxi", "Book a taxi.", "to", ["home", "work"]),
    enum_tool("set_volume", "Change the volume.", "level", ["low", "high"]),
]
NAMES = [t["name"] for t in TOOLS]
assert len(TOOLS) > DEFAULT_RETRIEVE_THRESHOLD


@pytest.fixture(scope="module")
def models() -> dict:
    return {name: needlepoint.load(get_fixture("needle2", name).cact) for name in NEEDLE2}


def independent_scores(model, tools: list[dict], query: str) -> np.ndarray:
    """The documented scoring, recomputed: compact tool JSON vs raw query, dot product."""
    texts = [json.dumps(t, separators=(",", ":"), ensure_ascii=False) for t in tools]
    query_embedding = model.embed(query)
    return np.array([float(model.embed(text) @ query_embedding) for text in texts])


def shown_names(needle: Needle, ids: list[int]) -> list[str]:
    """Tool names listed inside `<tools>...</tools>` of a decoded first-turn prompt."""
    text = needle.tokenizer.decode(ids)
    listed = json.loads(text.split("<tools>", 1)[1].split("</tools>", 1)[0])
    return [t["name"] for t in listed]


def feed(grammar, tokenizer, text: str) -> None:
    matcher = grammar.start()
    for token in continuation_ids(tokenizer, text):
        matcher.advance(token)


# ------------------------------------------------------------------ the embedding head
@pytest.mark.parametrize("name", NEEDLE2)
def test_embed_matches_fixture_contrastive(models, name):
    """`model.embed(text)` is the reference `p{k}_contrastive` (text = the full prompt)."""
    fixture, model = get_fixture("needle2", name), models[name]
    for prompt in fixture.meta["prompts"]:
        k = prompt["index"]
        assert [model.tokenizer.bos_id, *model.tokenizer.encode(prompt["text"])] == prompt["ids"]
        ours = model.embed(prompt["text"])
        reference = fixture.arrays[f"p{k}_contrastive"]
        cosine = float(ours @ reference) / float(np.linalg.norm(ours) * np.linalg.norm(reference))
        assert cosine >= 0.9999, (k, cosine)
        assert np.linalg.norm(ours) == pytest.approx(1.0, abs=1e-5)


# ------------------------------------------------------------------ ranking
@pytest.mark.parametrize("name", NEEDLE2)
def test_scores_and_ranking_match_independent_embeddings(models, name):
    model = models[name]
    needle = Needle(tools=TOOLS, model=model)
    expected = independent_scores(model, TOOLS, QUERY)
    ranked = needle.rank_tools(QUERY)
    assert sorted(t["name"] for _, t in ranked) == sorted(NAMES)
    by_name = {t["name"]: score for score, t in ranked}
    for tool_name, score in zip(NAMES, expected, strict=True):
        assert by_name[tool_name] == pytest.approx(score, abs=1e-5)
    scores = [score for score, _ in ranked]
    assert scores == sorted(scores, reverse=True)
    order = sorted(range(len(TOOLS)), key=lambda i: -expected[i])
    assert [t["name"] for _, t in ranked] == [NAMES[i] for i in order]
    assert needle.retrieve_tools(QUERY, k=3) == [TOOLS[i] for i in order[:3]]
    assert needle.retrieve_tools(QUERY) == [TOOLS[i] for i in order[:DEFAULT_RETRIEVE_K]]


def test_pure_selection_functions():
    scores = np.array([0.1, 0.9, 0.5, 0.9, -0.2])
    assert rank(scores) == [1, 3, 2, 0, 4]  # ties keep the original order
    assert top_k(scores, 3) == [1, 2, 3]  # chosen by score, listed in the original order
    assert top_k(scores, 10) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        top_k(scores, 0)


def test_tool_embeddings_are_computed_once(models):
    model = models["tiny"]

    class Counting:
        """The model, counting `embed` calls (tools once, then one call per query)."""

        def __init__(self) -> None:
            self.texts: list[str] = []

        def __getattr__(self, attr):
            return getattr(model, attr)

        def embed(self, text):
            self.texts.append(text)
            return model.embed(text)

    counting = Counting()
    needle = Needle(tools=TOOLS, model=counting, retrieve_k=2)
    assert counting.texts == []  # nothing embedded before the first retrieval
    needle.rank_tools("a")
    needle.retrieve_tools("b")
    needle.offered_tools("c")
    needle.prompt_ids("c")  # same query as the last offer: not embedded again
    assert len(counting.texts) == len(TOOLS) + 3
    assert counting.texts[-3:] == ["a", "b", "c"]


# ------------------------------------------------------------------ what the model is offered
@pytest.mark.parametrize("name", NEEDLE2)
def test_over_threshold_offers_top_k_to_prompt_and_grammar(models, name):
    """End to end: the prompt lists only the top k (in the caller's order), the turn's
    grammar is compiled for them and rejects any other tool, and `complete` returns a
    valid envelope."""
    model, k = models[name], K_FOR[name]
    needle = Needle(tools=TOOLS, model=model, retrieve_k=k, reasoning_budget=0,
                    max_new_tokens=60)
    assert needle.retrieval_active
    expected = independent_scores(model, TOOLS, QUERY)
    chosen = sorted(sorted(range(len(TOOLS)), key=lambda i: -expected[i])[:k])
    offered = [NAMES[i] for i in chosen]

    envelope = needle.complete(QUERY)
    fed = needle.state.conversation.ids
    prompt = needle.prompt_ids(QUERY)
    assert fed[:len(prompt)] == prompt
    assert shown_names(needle, prompt) == offered
    text = needle.tokenizer.decode(prompt)
    for tool_name in NAMES:
        assert (f'"name":"{tool_name}"' in text) == (tool_name in offered)

    grammar = needle.state.grammar
    assert grammar is not None and list(grammar.tool_names) == offered
    feed(grammar, needle.tokenizer, f'[{{"name":"{offered[0]}","arguments":')
    other = next(n for n in NAMES if n not in offered)
    with pytest.raises(GrammarError):
        feed(grammar, needle.tokenizer, f'[{{"name":"{other}","arguments":')

    assert envelope["type"] in ("call", "refuse") and envelope["stop_reason"] == "end"
    for call in envelope["function_calls"]:
        assert call["name"] in offered
    assert envelope["confidence"] is not None  # the Needle 2 fixtures have a head
    assert needle.planner.grammar_for(needle.offered_tools(QUERY)) is grammar  # cached per subset


@pytest.mark.parametrize("name", NEEDLE2)
def test_at_or_below_threshold_offers_every_tool(models, name):
    model = models[name]
    few = TOOLS[:3]
    needle = Needle(tools=few, model=model, reasoning_budget=0, max_new_tokens=60)
    assert not needle.retrieval_active
    envelope = needle.complete(QUERY)
    assert shown_names(needle, needle.state.conversation.ids) == NAMES[:3]
    assert needle.state.grammar is needle.planner.grammar
    assert list(needle.planner.grammar.tool_names) == NAMES[:3]
    assert envelope["type"] in ("call", "refuse") and envelope["stop_reason"] == "end"
    assert all(call["name"] in NAMES[:3] for call in envelope["function_calls"])
    # Exactly at the threshold still shows everything; `retrieve_tools` ranks regardless.
    at = Needle(tools=TOOLS[:DEFAULT_RETRIEVE_THRESHOLD], model=model)
    assert not at.retrieval_active
    assert shown_names(at, at.prompt_ids(QUERY)) == NAMES[:DEFAULT_RETRIEVE_THRESHOLD]
    assert len(at.retrieve_tools(QUERY, k=2)) == 2


def test_retrieval_can_be_switched_off_or_tuned(models):
    model = models["small"]
    off = Needle(tools=TOOLS, model=model, retrieve_k=None)
    assert not off.retrieval_active
    assert shown_names(off, off.prompt_ids(QUERY)) == NAMES
    assert len(off.retrieve_tools(QUERY)) == DEFAULT_RETRIEVE_K  # explicit ranking still works
    wide = Needle(tools=TOOLS, model=model, retrieve_threshold=len(TOOLS))
    assert not wide.retrieval_active
    narrow = Needle(tools=TOOLS[:4], model=model, retrieve_k=1, retrieve_threshold=2)
    assert narrow.retrieval_active
    assert shown_names(narrow, narrow.prompt_ids(QUERY)) == \
        [narrow.retrieve_tools(QUERY, k=1)[0]["name"]]
    for bad in ({"retrieve_k": 0}, {"retrieve_k": -1}, {"retrieve_threshold": -1},
                {"retrieve_k": 2.5}):
        with pytest.raises(ValueError):
            Needle(tools=TOOLS, model=model, **bad)
    with pytest.raises(ValueError):
        off.retrieve_tools(QUERY, k=0)


def test_more_tools_than_the_grammar_limit_with_retrieval(models):
    """Only subsets are compiled, so retrieval lifts the grammar's tool limit."""
    model = models["small"]
    many = [enum_tool(f"tool_{i}", f"Tool number {i}.", "x", ["a", "b"])
            for i in range(MAX_TOOLS + 2)]
    needle = Needle(tools=many, model=model, retrieve_k=3)
    assert needle.retrieval_active and needle.planner.grammar is None
    offered = [spec.name for spec in needle.offered_tools("tool 7")]
    assert len(offered) == 3
    assert list(needle.planner.grammar_for(needle.offered_tools("tool 7")).tool_names) == offered
    with pytest.raises(ToolSchemaError):  # without retrieval the full list must compile
        Needle(tools=many, model=model, retrieve_k=None)
    bad = {"name": "bad", "parameters": {"type": "object", "properties": {
        "a": {"type": "strnig"}}}}
    # every schema is still checked at construction: one the grammar cannot hold is dropped
    checked = Needle(tools=[*many, bad], model=model, retrieve_k=3)
    assert [d["name"] for d in checked.planner.dropped] == ["bad"]
    assert [spec.name for spec in checked.tools] == [spec["name"] for spec in many]


# ------------------------------------------------------------------ models without the head
def test_needle3_model_has_no_retrieval():
    model = needlepoint.load(get_fixture("needle3", "tiny").cact)
    needle = Needle(tools=TOOLS, model=model)
    assert not needle.retrieval_active  # default: off without a contrastive head
    assert shown_names(needle, needle.prompt_ids(QUERY)) == NAMES
    for call in (lambda: needle.retrieve_tools(QUERY, k=2), lambda: needle.rank_tools(QUERY)):
        with pytest.raises(RetrievalUnavailableError, match="contrastive embedding head"):
            call()
    assert issubclass(RetrievalUnavailableError, NeedlepointError)
    with pytest.raises(RetrievalUnavailableError):
        ToolIndex(model, TOOLS).embeddings  # noqa: B018 - the property does the work
