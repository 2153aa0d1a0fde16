"""The model-free parts of BFCL through the servers (`bfcl_serve`) and of the confidence's
calibration figures (`bfcl_calibration`): AUROC and ECE on hand-computed cases, the parsing
of llama.cpp's forced answers, the forced grammar's shape, the per-group summary."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from needlepoint_bench import bfcl_data
from needlepoint_bench.bfcl_calibration import auroc, bin_of, ece, reliability
from needlepoint_bench.bfcl_serve import (
    forced_gbnf,
    is_lost,
    modes_for,
    openai_calls,
    parse_blocks,
    summarise,
    wants_call,
)


def test_auroc_hand_computed():
    # right: 0.9, 0.4; wrong: 0.5, 0.1 -> pairs (0.9>0.5) (0.9>0.1) (0.4<0.5) (0.4>0.1) = 3/4
    assert auroc([0.9, 0.5, 0.4, 0.1], [True, False, True, False]) == 0.75
    # a tie counts one half: 1 pair, tied
    assert auroc([0.3, 0.3], [True, False]) == 0.5
    assert auroc([0.1, 0.9], [False, True]) == 1.0
    assert auroc([0.2, 0.9], [True, True]) is None


def test_ece_hand_computed():
    # bin 9: 0.95, 0.95 (one right): |0.5 - 0.95| = 0.45, weight 2/4
    # bin 1: 0.1, 0.1 (none right): |0 - 0.1| = 0.1, weight 2/4  -> 0.225 + 0.05
    scores = [0.95, 0.95, 0.1, 0.1]
    right = [True, False, False, False]
    assert ece(scores, right) == pytest.approx(0.275)
    assert ece([0.7, 0.7, 0.7], [True, True, False]) == pytest.approx(abs(2 / 3 - 0.7))
    assert ece([], []) is None


def test_bins_are_equal_width_and_the_last_is_closed():
    assert [bin_of(x) for x in (0.0, 0.099, 0.1, 0.55, 0.999, 1.0)] == [0, 0, 1, 5, 9, 9]
    rows = reliability([0.05, 1.0, 0.95], [False, True, True])
    assert rows == [{"bin": 0, "n": 1, "confidence": 0.05, "accuracy": 0.0},
                    {"bin": 9, "n": 2, "confidence": pytest.approx(0.975), "accuracy": 1.0}]


def test_parse_blocks_reads_every_call_block():
    text = ('{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n'
            '{"name": "g", "arguments": {}}\n</tool_call>')
    assert parse_blocks(text) == [{"name": "f", "arguments": {"x": 1}},
                                  {"name": "g", "arguments": {}}]
    assert parse_blocks('{"name": "f", "arguments": {"x": ') is None  # cut mid-call
    assert parse_blocks('{"arguments": {}}') is None  # no name
    assert parse_blocks("") == []


def test_forced_gbnf_wraps_the_converted_schema_in_call_blocks():
    seen = []

    def converter(schema: str) -> str:
        seen.append(schema)
        return 'root ::= "{}"\nspace ::= " "?\n'

    gbnf = forced_gbnf([{"name": "f", "parameters": {"type": "object"}}],
                       SimpleNamespace(json_schema_to_gbnf=converter))
    assert gbnf.splitlines()[0] == ('root ::= call "\\n</tool_call>" '
                                    '("\\n<tool_call>\\n" call "\\n</tool_call>")*')
    assert 'call ::= "{}"' in gbnf and gbnf.count("root ::=") == 1
    assert '"const": "f"' in seen[0] and '"required": ["name", "arguments"]' in seen[0]


def _call(name: str, arguments: str) -> SimpleNamespace:
    return SimpleNamespace(function=SimpleNamespace(name=name, arguments=arguments))


def test_openai_calls_flags_arguments_that_are_not_a_json_object():
    assert openai_calls([_call("f", '{"a": 1}')]) == ([{"name": "f", "arguments": {"a": 1}}],
                                                      False)
    assert openai_calls([_call("f", '{"a": ')]) == ([], True)
    assert openai_calls([_call("f", "[1]")]) == ([], True)
    assert openai_calls(None) == ([], False)


def test_irrelevance_and_relevance_run_in_auto_only():
    assert modes_for("irrelevance", ("forced", "auto")) == ("auto",)
    assert modes_for("live_relevance", ("forced", "auto")) == ("auto",)
    assert modes_for("live_simple", ("forced", "auto")) == ("forced", "auto")
    # a text answer cut at the token limit loses a call only where a call is wanted
    assert not wants_call("live_irrelevance") and wants_call("live_relevance")
    assert is_lost("simple_python", "forced", "length", [], "")
    assert is_lost("simple_python", "auto", "length", [], '```json\n{"name": "f", "argu')
    assert not is_lost("simple_python", "auto", "length", [], "To cook steak, first")
    assert not is_lost("irrelevance", "auto", "length", [], '{"name": "f"')
    assert not is_lost("simple_python", "forced", "length", [{"name": "f"}], "")
    assert not is_lost("simple_python", "forced", "stop", [], "")


def test_relevance_scoring_and_languages():
    assert bfcl_data.score_detail({}, "live_irrelevance", []) == (True, None)
    assert bfcl_data.score_detail({}, "irrelevance", [{"name": "f", "arguments": {}}]) == \
        (False, "irrelevance:called")
    assert bfcl_data.score_detail({}, "live_relevance", []) == (False, "relevance:no_call")
    assert bfcl_data.score_detail({}, "simple_python", None) == (False, "no_call")
    assert [bfcl_data.language_of(c) for c in ("simple_java", "simple_javascript",
                                               "simple_python", "multiple")] == \
        ["JAVA", "JAVASCRIPT", "PYTHON", "PYTHON"]


def test_summarise_counts_per_category_engine_and_mode():
    rows = [{"category": "simple_python", "engine": "e", "mode": "forced", "right": r,
             "lost": lost, "unparseable": False, "seconds": s}
            for r, lost, s in ((True, False, 2.0), (False, True, 4.0))]
    (summary,) = summarise(rows)
    assert summary == {"category": "simple_python", "engine": "e", "mode": "forced", "n": 2,
                       "right": 1, "accuracy": 0.5, "lost": 1, "unparseable": 0,
                       "s_per_case": 3.0}
