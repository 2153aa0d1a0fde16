"""`Needle` with and without speculative decoding (on by default): the same envelopes and
events, the `timings` fields (`decode_tokens`, `decode_passes`, drafts and acceptance per
source), the switch (`Needle(speculate=False)`, per call, `--no-speculate` in the CLI and the
server), multi-turn chats and the agent loop."""

from __future__ import annotations

import argparse

import pytest
from conftest import toy_model_path
from turn_helpers import ALARM, WEATHER

import needlepoint
from needlepoint.errors import InvalidOptionError
from needlepoint.generation.events import Done

TIMER = {"name": "set_timer", "description": "Start a countdown timer.",
         "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"},
                                                         "label": {"type": "string"}},
                        "required": ["minutes"]}}
TOOLS = [WEATHER, ALARM, TIMER]
DRAFT_KEYS = [f"{source}_{what}" for source in ("lookup", "grammar", "opening")
              for what in ("drafted", "accepted")]
QUERIES = ["wake me up at 06:45", "can you time 50 minutes for me",
           "what's the weather in Paris tomorrow"]


@pytest.fixture(scope="module")
def model():
    return needlepoint.load(toy_model_path())


def _same(a: dict, b: dict) -> None:
    """Two envelopes equal in everything but the timings."""
    strip = {k: v for k, v in a.items() if k not in ("timings", "turns")}
    assert strip == {k: v for k, v in b.items() if k not in ("timings", "turns")}
    for key in ("decode_tokens", "prefill_tokens"):
        assert a["timings"][key] == b["timings"][key]


@pytest.mark.parametrize("query", QUERIES)
def test_timings_report_passes_and_drafts(model, query):
    on = needlepoint.Needle(tools=TOOLS, model=model, seed=3).complete(query)
    off = needlepoint.Needle(tools=TOOLS, model=model, seed=3, speculate=False).complete(query)
    _same(on, off)
    timings = on["timings"]
    tokens = timings["decode_tokens"]
    assert {"decode_tokens", "decode_passes", *DRAFT_KEYS} <= set(timings)
    assert 0 < timings["decode_passes"] <= tokens / 2
    for source in ("lookup", "grammar", "opening"):
        assert 0 <= timings[f"{source}_accepted"] <= timings[f"{source}_drafted"]
    assert timings["grammar_accepted"] > 0 and timings["opening_accepted"] > 0
    # every token is the prefill's pick, one verifying pass's, or an accepted draft token
    accepted = sum(timings[f"{s}_accepted"] for s in ("lookup", "grammar", "opening"))
    assert 1 + timings["decode_passes"] + accepted >= tokens
    assert off["timings"]["decode_passes"] == tokens - 1
    assert all(off["timings"][key] == 0 for key in DRAFT_KEYS)


def test_switch_per_call_and_validation(model):
    needle = needlepoint.Needle(tools=TOOLS, model=model, speculate=False)
    assert needle.config().speculate is False
    assert needle.config(speculate=True).speculate is True
    on = needle.complete(QUERIES[0], speculate=True)
    assert on["timings"]["decode_passes"] < on["timings"]["decode_tokens"] - 1
    assert needlepoint.Needle(tools=TOOLS, model=model).config().speculate is True
    with pytest.raises(InvalidOptionError, match="speculate"):
        needle.complete(QUERIES[0], speculate="yes")


def test_sampled_streams_are_the_same_events(model):
    events = {}
    for speculate in (True, False):
        needle = needlepoint.Needle(tools=TOOLS, model=model, speculate=speculate,
                                    temperature=0.9, seed=-12345)
        events[speculate] = [
            (type(e).__name__, getattr(e, "text", None)) if not isinstance(e, Done) else
            e.envelope["function_calls"] for e in needle.stream(QUERIES[2], logprobs=1)]
    assert events[True] == events[False] and len(events[True]) > 5


def test_chats_and_agent_loops_are_unchanged(model):
    runs = {}
    for speculate in (True, False):
        needle = needlepoint.Needle(tools=TOOLS, model=model, speculate=speculate,
                                    temperature=0.7, seed=7)
        first = needle.chat(QUERIES[1])
        second = needle.send_tool_results([{"name": "set_timer", "result": "ok"}])
        third = needle.chat("and the weather in Oslo")
        runs[speculate] = (first, second, third, needle.run(QUERIES[0]))
    for on, off in zip(runs[True], runs[False], strict=True):
        _same(on, off)
    loop = runs[True][3]
    assert loop["timings"]["decode_passes"] == sum(
        turn["timings"]["decode_passes"] for turn in loop["turns"])


def test_cli_and_server_switch(model):
    from needlepoint.cli.common import add_model_arguments, build_needle
    from needlepoint.server import cli as server_cli
    from needlepoint.server.engine import Engine

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(["--no-speculate", "--model", str(toy_model_path())])
    assert build_needle(args).config().speculate is False
    args = parser.parse_args(["--model", str(toy_model_path())])
    assert build_needle(args).config().speculate is True

    serve_parser = argparse.ArgumentParser()
    server_cli.add_arguments(serve_parser)
    assert serve_parser.parse_args([]).speculate is True
    assert serve_parser.parse_args(["--no-speculate"]).speculate is False
    made = []

    def factory(**kwargs):
        made.append(kwargs)
        return kwargs

    Engine(model, needle_factory=factory).needle([ALARM], "")
    Engine(model, needle_factory=factory, speculate=False).needle([ALARM], "")
    assert "speculate" not in made[0] and made[1]["speculate"] is False


def test_confidence_is_unchanged_on_a_model_with_a_confidence_head():
    from conftest import get_fixture

    tiny = needlepoint.load(get_fixture("needle3", "tiny").cact)
    assert tiny.has_confidence_head
    for query in QUERIES[:2]:
        envelopes = [needlepoint.Needle(tools=TOOLS, model=tiny, speculate=speculate,
                                        reasoning_budget=0, max_new_tokens=40,
                                        seed=5).complete(query) for speculate in (True, False)]
        _same(*envelopes)
        assert envelopes[0]["confidence"] is not None
        assert envelopes[0]["timings"]["decode_passes"] < envelopes[1]["timings"][
            "decode_passes"]
