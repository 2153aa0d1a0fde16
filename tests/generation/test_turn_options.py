"""The turn options behind the OpenAI conformance work, on a scripted session with the toy
model's real tokenizer and real grammars: a required call (no `[]`), at most one call, stop
sequences, per-token logprobs, text-only turns, the JSON content constraint, non-finite
logits, and the one seed rule."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import toy_model_path
from fake_model import ScriptedModel, answer_ids
from turn_helpers import toy_grammar_vocab, toy_tokenizer, toy_turn_vocab  # noqa: F401 (fixtures, requested by name)

from needlepoint.errors import InvalidOptionError, NonFiniteActivationError
from needlepoint.formats.needle_wire import prompt_ids, render_prompt
from needlepoint.generation.content import JSON_OBJECT, ContentGrammar
from needlepoint.generation.events import LogprobDelta, TextDelta
from needlepoint.generation.grammar import GrammarError, ToolCallGrammar
from needlepoint.generation.sampling import SamplingConfig, check_seed, position_rng
from needlepoint.generation.stops import StopFilter
from needlepoint.generation.turn import GenerationConfig, generate_turn, run_turn
from needlepoint.models.protocol import SessionCapabilities

ALARM = {"name": "set_alarm", "description": "Set an alarm.",
         "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                        "required": ["time"]}}
TIMER = {"name": "set_timer", "description": "Start a timer.",
         "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                        "required": ["minutes"]}}
TOOLS = [ALARM, TIMER]
TWO_CALLS = ('[{"name":"set_alarm","arguments":{"time":"06:45"}},'
             '{"name":"set_timer","arguments":{"minutes":5}}]')


def prompt(tokenizer, query="wake me at 6:45 and time 5 minutes"):
    return prompt_ids(tokenizer, render_prompt(TOOLS, query))


def after_marker(tokenizer, text):
    ids = tokenizer.encode("<tool_call>" + text)
    return ids[ids.index(tokenizer.marker_id("<tool_call>")) + 1:]


# ------------------------------------------------------------------ call count grammars
def test_required_grammar_has_no_empty_list(tokenizer, vocab, grammar_vocab):
    required = ToolCallGrammar(grammar_vocab, TOOLS, require_call=True)
    m = required.start()
    with pytest.raises(GrammarError):
        for token in after_marker(tokenizer, "[]"):
            m.advance(token)
    # A model that wants to refuse is made to call something instead.
    wants_refusal = answer_ids(tokenizer, "<tool_call>[]</tool_call><|im_end|>")
    model = ScriptedModel(tokenizer, wants_refusal, strength=40)
    plain = run_turn(model.session(), vocab, prompt(tokenizer), GenerationConfig(),
                     ToolCallGrammar(grammar_vocab, TOOLS))
    assert json.loads(plain.call_text) == []
    forced = run_turn(model.session(), vocab, prompt(tokenizer),
                      GenerationConfig(require_call=True), required)
    calls = json.loads(forced.call_text)
    assert len(calls) >= 1 and {c["name"] for c in calls} <= {"set_alarm", "set_timer"}


def test_single_call_grammar_stops_after_one_call(tokenizer, vocab, grammar_vocab):
    wants_two = answer_ids(tokenizer, f"<tool_call>{TWO_CALLS}</tool_call><|im_end|>")
    model = ScriptedModel(tokenizer, wants_two, strength=40)
    both = run_turn(model.session(), vocab, prompt(tokenizer), GenerationConfig(),
                    ToolCallGrammar(grammar_vocab, TOOLS))
    assert len(json.loads(both.call_text)) == 2
    single = ToolCallGrammar(grammar_vocab, TOOLS, parallel_calls=False)
    one = run_turn(model.session(), vocab, prompt(tokenizer), GenerationConfig(), single)
    calls = json.loads(one.call_text)  # where the model wanted `,{` the grammar said no
    assert one.call_closed and len(calls) == 1 and calls[0]["name"] == "set_alarm"
    exactly_one = ToolCallGrammar(grammar_vocab, TOOLS, parallel_calls=False,
                                  require_call=True)
    assert "more" not in exactly_one.lark and '""' not in exactly_one.lark.split("calls:")[1]


# ------------------------------------------------------------------ stop sequences
def test_stop_filter_holds_back_possible_starts():
    f = StopFilter(("END", "\n\n"))
    assert [f.feed(p) for p in ("hel", "lo E", "N", "D more")] == ["hel", "lo ", "", ""]
    assert f.hit == "END"
    g = StopFilter(("abc",))
    assert [g.feed(p) for p in ("xa", "b", "x")] == ["x", "", "abx"] and g.flush() == ""


def test_stop_sequence_ends_the_answer_text(tokenizer, vocab):
    model = ScriptedModel(tokenizer, answer_ids(tokenizer, "Hello there. END of it<|im_end|>"),
                          strength=40)
    config = GenerationConfig(stop=("END",), reasoning_budget=None)
    events = list(generate_turn(model.session(), vocab, prompt(tokenizer), config))
    result = events[-1].result
    assert result.stop_reason == "stop"
    assert result.text == "Hello there."
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert streamed == result.text and "END" not in streamed
    unstopped = run_turn(model.session(), vocab, prompt(tokenizer),
                         GenerationConfig(reasoning_budget=None))
    assert unstopped.text.startswith("Hello there. END")  # the same answer, not stopped
    for bad in (["a"] * 5, [""], [3], "", 7):
        with pytest.raises(InvalidOptionError, match="stop"):
            GenerationConfig(stop=bad)


# ------------------------------------------------------------------ logprobs
def test_logprobs_are_the_models_unmasked_log_softmax(tokenizer, vocab):
    model = ScriptedModel(tokenizer, answer_ids(tokenizer, "Good morning<|im_end|>"),
                          strength=6, noise=1.0)
    config = GenerationConfig(logprobs=3, reasoning_budget=None)
    session = model.session()
    events = list(generate_turn(session, vocab, prompt(tokenizer), config))
    result = events[-1].result
    entries = [e.entry for e in events if isinstance(e, LogprobDelta)]
    assert entries == result.logprobs and len(entries) == len(result.tokens) - 1  # no im_end
    # Independently: replay the session and take log-softmax of its logits at each step.
    replay = model.session()
    logits = replay.prefill(prompt(tokenizer))
    for token, entry in zip(result.tokens, entries, strict=False):
        x = logits.astype(np.float64)
        expected = x[token] - (x.max() + math.log(np.exp(x - x.max()).sum()))
        assert entry["logprob"] == pytest.approx(expected, abs=1e-9)
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert tops[0] == pytest.approx(x.max() - (x.max() + math.log(np.exp(x - x.max()).sum())))
        assert bytes(entry["bytes"]).decode() == entry["token"]
        logits = replay.step(token)
    assert "".join(e["token"] for e in entries) == result.text
    assert run_turn(model.session(), vocab, prompt(tokenizer), GenerationConfig()).logprobs \
        is None
    with pytest.raises(InvalidOptionError, match="logprobs"):
        GenerationConfig(logprobs=21)


# ------------------------------------------------------------------ text-only turns
def test_text_only_turn_never_calls(tokenizer, vocab, grammar_vocab):
    wants_call = answer_ids(tokenizer, "<tool_call>[]</tool_call><|im_end|>")
    model = ScriptedModel(tokenizer, wants_call, strength=40)
    result = run_turn(model.session(), vocab, prompt(tokenizer),
                      GenerationConfig(allow_call=False, max_new_tokens=12, reasoning_budget=0),
                      ToolCallGrammar(grammar_vocab, TOOLS))
    assert vocab.markers.tool_call_open not in result.tokens and result.call_text is None
    assert not result.forced_call  # a budget never forces a call in a text-only turn
    thinking = answer_ids(tokenizer, "<think>\n" + "la " * 50)
    closed = run_turn(ScriptedModel(tokenizer, thinking).session(), vocab, prompt(tokenizer),
                      GenerationConfig(allow_call=False, max_new_tokens=40, reasoning_budget=8))
    assert vocab.markers.think_close in closed.tokens[:12]  # the budget closes the think block
    assert vocab.markers.tool_call_open not in closed.tokens
    with pytest.raises(InvalidOptionError):
        GenerationConfig(allow_call=False, require_call=True)


# ------------------------------------------------------------------ JSON content
def test_json_content_constraint_on_garbage_wanting_model(tokenizer, vocab, grammar_vocab):
    """The issue's symptom: unconstrained, the answer text was `zzza"}}]"}}]...`."""
    garbage = answer_ids(tokenizer, 'zzza"}}]"}}]hhhh"}}]<|im_end|>')
    model = ScriptedModel(tokenizer, garbage, strength=40, noise=0.5)
    free = run_turn(model.session(), vocab, prompt(tokenizer),
                    GenerationConfig(reasoning_budget=None, allow_call=False))
    assert free.text.startswith("zzza")
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum":
              ["yes", "no"]}}, "required": ["answer"], "additionalProperties": False}
    content = ContentGrammar(grammar_vocab, schema, im_end_id=vocab.markers.im_end)
    result = run_turn(model.session(), vocab, prompt(tokenizer),
                      GenerationConfig(reasoning_budget=None), content=content)
    assert result.stop_reason == "end"
    assert json.loads(result.text) in ({"answer": "yes"}, {"answer": "no"})


def test_json_object_on_the_toy_model(tokenizer, vocab, grammar_vocab):
    import needlepoint

    model = needlepoint.load(toy_model_path())
    content = ContentGrammar(grammar_vocab, JSON_OBJECT, im_end_id=vocab.markers.im_end)
    ids = prompt_ids(tokenizer, render_prompt([], "play some jazz"))
    result = run_turn(model.session(), vocab, ids, GenerationConfig(max_new_tokens=60),
                      content=content)
    assert result.stop_reason == "end" and isinstance(json.loads(result.text), dict)


# ------------------------------------------------------------------ non-finite logits
class NaNSession:
    """A session that writes one text token over and over, until its logits turn NaN at
    decode step `bad_step` (0: at prefill)."""

    def __init__(self, vocab_size: int, bad_step: int, token: int) -> None:
        self.position, self.bad_step, self.steps, self.vocab = 0, bad_step, 0, vocab_size
        self.token = token

    def _logits(self):
        x = np.zeros(self.vocab, np.float32)
        x[self.token] = 3.0
        if self.steps == self.bad_step:
            x[7] = np.nan
        return x

    capabilities = SessionCapabilities()  # prefill and step only

    def prefill(self, ids, logits=True):
        self.position += len(ids)
        return self._logits()

    def step(self, token):
        self.position += 1
        self.steps += 1
        return self._logits()


@pytest.mark.parametrize("bad_step", [0, 3])
def test_non_finite_logits_raise_a_typed_error(tokenizer, vocab, bad_step):
    session = NaNSession(tokenizer.vocab_size, bad_step, tokenizer.encode("hello")[-1])
    with pytest.raises(NonFiniteActivationError, match="non-finite logits") as err:
        run_turn(session, vocab, prompt(tokenizer), GenerationConfig(reasoning_budget=None))
    assert "inspect --verify" in str(err.value)
    assert isinstance(err.value, ArithmeticError)


# ------------------------------------------------------------------ the seed rule
def test_negative_seeds_are_distinct_streams():
    draws = {seed: [position_rng(seed, p).random() for p in range(4)]
             for seed in (-5, -6, -1000, 5, 2**63 - 1, -(2**63))}
    assert len({tuple(v) for v in draws.values()}) == len(draws)
    assert position_rng(-5, 2).random() == position_rng(-5, 2).random()


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, True, 1.5, "3"])
def test_seed_outside_int64_is_refused(seed):
    with pytest.raises(InvalidOptionError, match="seed"):
        check_seed(seed)
    with pytest.raises(ValueError, match=r"\[-2\*\*63, 2\*\*63\)"):
        SamplingConfig(seed=seed)


@pytest.mark.parametrize(("option", "value"), [
    ("temperature", "hot"), ("temperature", float("nan")), ("temperature", -1),
    ("top_p", 5), ("top_p", "x"), ("top_k", -1), ("top_k", 2.5),
])
def test_sampling_option_errors_name_the_option(option, value):
    with pytest.raises(InvalidOptionError) as err:
        SamplingConfig(**{option: value})
    message = str(err.value)
    assert message.startswith(option) and repr(value) in message and "must be" in message
