"""Between a template model's calls (`generation/marker_tokens.py`), on the qwen2-tiny
fixture's tokenizer (its `<tool_call>` / `</tool_call>` are single added tokens) and scripted
logits: at each step logit 0 on the scripted token, chosen logits on a few alternatives, -60
elsewhere.

In an answer that must call, at the closing marker's position, a model that clearly wants
another call (its `{` at least `MORE_AT`) goes on, and one that wants its end more than
another call ends there; the separator it prefers after `</tool_call>` no longer commits to
a second call. Otherwise (and always in auto answers) it decides after the marker, as before.
Once the choice is made the markers are their own tokens, never pieces."""

from __future__ import annotations

import numpy as np
import pytest
from fake_model import AnswerScript
from hf_helpers import hf_reference

from needlepoint.api.envelope import turn_envelope
from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.generation import marker_tokens
from needlepoint.generation.answer_grammar import AnswerGrammar, token_vocab, turn_vocab
from needlepoint.generation.turn import run_turn
from needlepoint.generation.turn_config import GenerationConfig

TOOLS = [{"name": "set_alarm", "description": "Set an alarm.", "parameters": {
    "type": "object", "properties": {"time": {"type": "string"}}, "required": ["time"]}}]
ALARM = {"name": "set_alarm", "arguments": {"time": "06:45"}}
LATER = {"name": "set_alarm", "arguments": {"time": "07:00"}}


@pytest.fixture(scope="module")
def fmt():
    return TemplateFormat(open_hf_directory(hf_reference("qwen2-tiny").folder).tokenizer)


def ids(fmt, text: str) -> list[int]:
    return list(fmt.tokenizer.encode(text, add_special_tokens=False))


def block(fmt, time: str) -> list[int]:
    """One call block as the template renders it, `</tool_call>` its own token."""
    return ids(fmt, f'<tool_call>\n{{"name": "set_alarm", "arguments": {{"time": "{time}"}}}}\n') \
        + [fmt.markers["</tool_call>"]]


def answer(fmt, script: list[int], alternatives: dict[int, dict[int, float]],
           require: bool = True):
    config = GenerationConfig(max_new_tokens=200, reasoning_budget=None, speculate=False,
                              require_call=require)
    grammar = AnswerGrammar(token_vocab(fmt), fmt, TOOLS, text=not require,
                            require_call=require)
    session = AnswerScript(len(fmt.tokenizer.all_token_bytes()), script, alternatives)
    return run_turn(session, turn_vocab(fmt), fmt.first_ids(TOOLS, "Wake me at 6:45."),
                    config, content=grammar)


def test_the_fixture_spells_the_markers_as_single_tokens(fmt):
    first = block(fmt, "06:45")
    assert first[0] == fmt.markers["<tool_call>"]
    assert fmt.tokenizer.decode(first[-2:-1]).endswith("\n")  # `"}}\n` before the marker


def test_an_end_wanted_at_the_closing_marker_ends_the_answer(fmt):
    """The model's top tokens at the closing marker are its end token, then another call's
    `{`; after `</tool_call>` it prefers the separator (as Qwen2.5-Coder does) and would
    then be forced into a second call. The choice at the marker ends the answer."""
    first, second = block(fmt, "06:45"), block(fmt, "07:00")
    end, brace = fmt.end_ids[0], ids(fmt, "{")[0]
    close_at = len(first) - 1
    script = first + ids(fmt, "\n") + second + [end]
    alternatives = {close_at: {end: 5.0, brace: 3.0}}
    result = answer(fmt, script, alternatives)
    assert turn_envelope(result)["function_calls"] == [ALARM]
    assert result.tokens == first + [end] and result.stop_reason in ("end", "eos")
    between = [d for d in result.decisions if d.kind == "between"]
    assert [d.prob for d in between] == pytest.approx([1 / (1 + np.exp(-2.0))], abs=1e-6)


def test_another_call_wanted_at_the_closing_marker_goes_on(fmt):
    """Another call's `{` on top at the closing marker: the answer goes on to the second
    call even though the model's end token leads right after `</tool_call>`."""
    first, second = block(fmt, "06:45"), block(fmt, "07:00")
    end, brace = fmt.end_ids[0], ids(fmt, "{")[0]
    close_at = len(first) - 1
    newline = ids(fmt, "\n")
    script = first + newline + second + [end]
    alternatives = {close_at: {brace: 5.0, end: 3.0}, close_at + 1: {end: 4.0}}  # {: 0.87
    result = answer(fmt, script, alternatives)
    assert turn_envelope(result)["function_calls"] == [ALARM, LATER]
    assert result.tokens == script


@pytest.mark.parametrize("alternatives", [
    {"end": -1.0, "marker": 0.0},  # the closing marker is the model's own top token
    {"brace": 1.0, "end": 0.5},  # another call likelier than the end, not clearly (0.51)
])
def test_otherwise_the_model_decides_after_the_marker(fmt, alternatives):
    """No choice at the marker: the tokens after it are the model's, as before (here the
    separator after `</tool_call>`, so a second call)."""
    first, second = block(fmt, "06:45"), block(fmt, "07:00")
    end, brace = fmt.end_ids[0], ids(fmt, "{")[0]
    script = first + ids(fmt, "\n") + second + [end]
    names = {"end": end, "brace": brace, "marker": first[-1]}
    result = answer(fmt, script, {len(first) - 1: {names[k]: v for k, v in
                                                  alternatives.items() if k != "marker"}})
    assert turn_envelope(result)["function_calls"] == [ALARM, LATER]
    assert result.tokens == script


def test_an_auto_answer_decides_after_the_marker_as_before(fmt):
    first, second = block(fmt, "06:45"), block(fmt, "07:00")
    end, brace = fmt.end_ids[0], ids(fmt, "{")[0]
    script = first + ids(fmt, "\n") + second + [end]
    result = answer(fmt, script, {len(first) - 1: {end: 5.0, brace: 3.0}}, require=False)
    assert turn_envelope(result)["function_calls"] == [ALARM, LATER]


def test_marker_pieces_are_not_written_once_the_choice_is_made(fmt):
    """After `"}}\\n` the model's top token is `<` (a piece of `</tool_call>`) and it wants
    its end more than another call: the marker is written as its own token, then the end."""
    first = block(fmt, "06:45")
    end = fmt.end_ids[0]
    less = ids(fmt, "<")[0]
    script = first[:-1] + [less, end]
    result = answer(fmt, script, {len(first) - 1: {end: -0.5}})
    assert result.tokens == first + [end]
    assert result.tokens[len(first) - 1] == first[-1]
    assert turn_envelope(result)["function_calls"] == [ALARM]


def test_the_masks():
    token_bytes = [b"<tool_call>", b"</tool_call>", b"<", b"</", b"\n<", b"</tool", b">\n",
                   b"a<b", b"{", b' {"', b",{", b"x{", b"\n"]
    markers = {"<tool_call>": 0, "</tool_call>": 1}
    pieces = marker_tokens.marker_pieces(token_bytes, markers)
    assert pieces.tolist() == [False, False, True, True, True, True, False, False, False,
                               False, False, False, False]
    assert marker_tokens.marker_pieces(token_bytes, {}) is None
    starts = marker_tokens.call_starts(token_bytes, 0)
    assert np.flatnonzero(starts).tolist() == [0, 8, 9, 10]
    allowed = np.array([False, False, True, True, False, False, False, False, False, False,
                        False, False, True])
    assert np.flatnonzero(marker_tokens.between_calls(allowed, pieces)).tolist() == [12]
    after = np.zeros(len(token_bytes), bool)
    after[[6, 12]] = True  # an end token (here id 6) and the separator
    stops = frozenset({6})
    assert np.flatnonzero(marker_tokens.after_close(after, stops, "end")).tolist() == [6]
    assert np.flatnonzero(marker_tokens.after_close(after, stops, "more")).tolist() == [12]
