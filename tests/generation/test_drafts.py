"""Draft proposals for speculative decoding (`generation/drafts.py`): the n-gram prompt
lookup, the grammar's fast-forward tokens, cutting a draft where the grammar (or the free
phase) rejects it, stop tokens, and the room limit. The real toy tokenizer and tool grammar."""

from __future__ import annotations

import numpy as np
from turn_helpers import (  # noqa: F401 (fixtures, requested by name)
    ALARM,
    CITY_WEATHER,
    toy_grammar_vocab,
    toy_tokenizer,
    toy_turn_vocab,
)

from needlepoint.generation.drafts import (
    GRAMMAR,
    LOOKUP,
    Drafter,
    DraftState,
    NgramIndex,
    lookup_kind,
    match_keys,
)
from needlepoint.generation.grammar import ToolCallGrammar


def _json_ids(grammar_vocab, text: str) -> list[int]:
    return grammar_vocab._encode(text)  # the tokenization after `<tool_call>` (training's)


# ---------------------------------------------------------------- n-gram index
def test_lookup_takes_the_longest_match():
    index = NgramIndex()
    # "2 3" is followed by 9 the first time, "1 2 3" by 7: the longer match wins
    index.extend([1, 2, 3, 7, 8, 5, 2, 3, 9, 6, 1, 2, 3])
    assert index.lookup(index.tokens, 2) == [7, 8]


def test_lookup_takes_the_most_recent_occurrence_and_never_the_tail_itself():
    index = NgramIndex()
    index.extend([4, 5, 1, 4, 6, 2, 4])
    assert index.lookup([4], 1) == [6]  # the 4 before the tail's own 4, not the first one
    assert list(index.candidates([4], 2)) == [[6, 2], [5, 1]]  # newest first
    assert index.lookup([8], 3) == []
    index.extend([6])
    assert index.lookup(index.tokens, 3) == [2, 4, 6]  # "4 6" ended at 4: it continues 2 4 6


def test_lookup_limit_and_empty_cases():
    index = NgramIndex()
    assert index.lookup([1], 4) == []
    index.extend([1, 2, 3, 4, 5, 6, 1])
    assert index.lookup([1], 3) == [2, 3, 4]
    assert index.lookup([1], 0) == [] and index.lookup([], 3) == []
    assert len(index) == 7


def test_candidates_fall_back_to_shorter_ngrams_and_older_occurrences():
    index = NgramIndex(max_n=3)
    index.extend([7, 1, 2, 8, 9, 2, 5, 3, 2])
    # tail "3 2" never occurred before; "2" ended at 5 (-> 5) and at 2 (-> 8)
    assert list(index.candidates([3, 2], 2)) == [[5, 3], [8, 9]]


def test_lookup_continues_a_tail_that_ends_in_draft_tokens():
    index = NgramIndex()
    index.extend([10, 11, 12, 13, 20])
    # the tail is the indexed tokens plus drafted 10, 11: continue after their match
    assert index.lookup([20, 10, 11], 2) == [12, 13]


def test_match_keys_ignore_the_leading_space(tokenizer, grammar_vocab):
    keys = match_keys(tokenizer.all_token_bytes())
    spaced = tokenizer.encode("the lights in the hall")  # "▁the" "▁lights" ...: the query
    plain = _json_ids(grammar_vocab, "lights")  # inside JSON: no leading space
    assert tokenizer.token_bytes(spaced[1]) == b" lights" and len(plain) == 1
    assert keys[spaced[1]] == keys[plain[0]] == plain[0] != spaced[1]
    index = NgramIndex(keys)
    index.extend(spaced)  # the query, then the model writes "lights" inside a JSON string
    assert index.lookup([plain[0]], 3) == spaced[2:5]
    plain_index = NgramIndex()
    plain_index.extend(spaced)
    assert plain_index.lookup([plain[0]], 3) == []  # without the keys there is no match


# ---------------------------------------------------------------- grammar fast-forward
def test_forced_tokens_are_drafted_as_grammar(grammar_vocab):
    grammar = ToolCallGrammar(grammar_vocab, [ALARM])
    matcher = grammar.start()
    call = _json_ids(grammar_vocab, '[{"name":"set_alarm","arguments":{"time":"06:45"}}]')
    matcher.advance(call[0])  # `[{"`: one tool, so the name and the first key are forced
    drafter = Drafter(NgramIndex())
    draft = drafter.propose(DraftState(matcher), lookup_budget=8, room=32)
    assert draft.tokens == matcher.forced_tokens() == call[1:10]
    assert set(draft.sources) == {GRAMMAR}
    assert matcher.tokens == [call[0]]  # the turn's matcher did not move
    # the room bounds the draft, forced tokens included
    assert drafter.propose(DraftState(matcher), 8, room=3).tokens == call[1:4]


def test_lookup_after_forced_tokens_and_cut_at_the_first_rejected_token(grammar_vocab,
                                                                         tokenizer):
    grammar = ToolCallGrammar(grammar_vocab, [ALARM, CITY_WEATHER])
    call = _json_ids(grammar_vocab, '[{"name":"get_weather","arguments":{"city":"Paris"}}]')
    matcher = grammar.start()
    for token in call[:3]:  # `[{"` `name` `":"`: the name is open
        matcher.advance(token)
    # the prompt lists the tool as in the tools block: `get_weather","description...`
    prompt = _json_ids(grammar_vocab, '{"name":"get_weather","description":"x"}')
    index = NgramIndex()
    index.extend(prompt + call[:3])
    draft = Drafter(index).propose(DraftState(matcher), lookup_budget=8, room=32)
    name = _json_ids(grammar_vocab, "get_weather")
    # lookup proposes the name and `","`, then `description` (rejected: cut there); the
    # grammar then forces `arguments":{"city`
    assert draft.tokens[: len(name) + 1] == call[3 : 4 + len(name)]
    assert draft.sources[: len(name) + 1] == [LOOKUP] * (len(name) + 1)
    # acceptance classes: the n-gram length of the match (`name":"`: the prompt has `{"`,
    # not `[{"`, before it), whether the token starts the guess
    first, *rest_kinds = draft.kinds[: len(name) + 1]
    assert first == lookup_kind(2, True) == "lookup2"
    assert rest_kinds == [lookup_kind(2, False)] * len(name) == ["lookup2+"] * len(name)
    assert draft.kinds[len(name) + 1 :] == [GRAMMAR] * (len(draft) - len(name) - 1)
    rest = draft.tokens[len(name) + 1 :]
    assert rest and set(draft.sources[len(name) + 1 :]) == {GRAMMAR}
    assert b"description" not in b"".join(tokenizer.token_bytes(t) for t in draft.tokens)
    check = matcher.fork()
    assert check.advance_prefix(draft.tokens) == len(draft.tokens)  # all of it is valid


def test_a_rejected_first_lookup_token_tries_the_next_candidate(grammar_vocab, tokenizer):
    grammar = ToolCallGrammar(grammar_vocab, [ALARM])
    matcher = grammar.start()
    call = _json_ids(grammar_vocab, '[{"name":"set_alarm","arguments":{"time":"06:45"}}]')
    for token in call[:12]:  # ... `":"0` `6`: inside the time string
        matcher.advance(token)
    six, text = call[11], _json_ids(grammar_vocab, "pq rs")
    special = tokenizer.marker_id("<|im_start|>")  # never allowed inside JSON
    index = NgramIndex()
    index.extend([six, call[12], text[0], text[1], six, special, text[2], six])
    # the latest earlier "6" continues with a special token: rejected, the older one is used
    assert index.lookup([six], 2) == [special, text[2]]
    draft = Drafter(index).propose(DraftState(matcher), lookup_budget=2, room=2)
    assert draft.tokens == [call[12], text[0]] and draft.sources == [LOOKUP, LOOKUP]


def test_stop_tokens_end_a_draft(vocab, grammar_vocab):
    grammar = ToolCallGrammar(grammar_vocab, [ALARM])
    matcher = grammar.start()
    call = _json_ids(grammar_vocab, '[{"name":"set_alarm","arguments":{"time":"06:45"}}]')
    for token in call:
        matcher.advance(token)
    m = vocab.markers
    drafter = Drafter(NgramIndex(), stop_ids=m.stops)
    # after `]`: `</tool_call>` is drafted, `<|im_end|>` (a stop: never stepped) is not
    assert drafter.propose(DraftState(matcher), 4, 8).tokens == [grammar_vocab.end_ids[0]]
    assert Drafter(NgramIndex()).propose(DraftState(matcher), 4, 8).tokens == list(
        grammar_vocab.end_ids)
    index = NgramIndex()
    index.extend([3, 4, m.im_end, 6, 3])
    assert Drafter(index, stop_ids=m.stops).propose(DraftState(), 4, 8).tokens == [4]


def test_free_phase_cut_and_entering_the_call(vocab, grammar_vocab, tokenizer):
    m = vocab.markers
    grammar = ToolCallGrammar(grammar_vocab, [ALARM])
    user = tokenizer.marker_id("<|im_start|>")
    a, b, c = _json_ids(grammar_vocab, "pq rs tu")[:3]
    index = NgramIndex()
    index.extend([a, b, user, c, a])
    drafter = Drafter(index, vocab.free_mask, m.stops)
    # a role marker is never free-phase text: the draft stops before it
    assert drafter.propose(DraftState(free=True), 4, 8).tokens == [b]
    assert Drafter(index).propose(DraftState(free=True), 4, 8).tokens == [b, user, c, a]
    # a draft that writes `<tool_call>` continues under the call grammar: `[{"` is looked
    # up, then the grammar forces the single tool's name
    call = _json_ids(grammar_vocab, '[{"name":"set_alarm","arguments":{"time":"06:45"}}]')
    index = NgramIndex()
    index.extend([a, m.tool_call_open, call[0], b, a])
    state = DraftState(free=True, call_open=m.tool_call_open, constraint=grammar)
    draft = Drafter(index, vocab.free_mask, m.stops).propose(state, 8, 32)
    assert draft.tokens[:3] == [m.tool_call_open, call[0], call[1]]
    assert draft.sources[:3] == [LOOKUP, LOOKUP, GRAMMAR]
    assert draft.tokens[2:] == call[1:10]  # b never follows `[{"`: the grammar ruled it out


def test_matchers_without_lookahead_are_not_used(grammar_vocab):
    class Bare:  # a Constraint's matcher with only the turn-loop interface
        def allowed_mask(self):
            return np.ones(4, bool)

        def advance(self, token):
            pass

        def is_finished(self):
            return False

    index = NgramIndex()
    index.extend([1, 2, 3, 1])
    # unchecked: the lookup runs on through its own repetition
    assert Drafter(index).propose(DraftState(Bare()), 4, 8).tokens == [2, 3, 1, 2]


def test_matcher_fork_and_advance_prefix(grammar_vocab):
    grammar = ToolCallGrammar(grammar_vocab, [ALARM])
    matcher = grammar.start()
    call = _json_ids(grammar_vocab, '[{"name":"set_alarm","arguments":{"time":"06:45"}}]')
    other = matcher.fork()
    assert other.advance_prefix(call[:5] + [grammar_vocab.eos_id] + call[5:]) == 5
    assert other.tokens == call[:5] and matcher.tokens == []
    assert other.advance_prefix([-1]) == 0 and other.advance_prefix([]) == 0
    assert other.advance_prefix(call[5:]) == len(call) - 5
    assert matcher.allowed_mask()[call[0]] and not other.is_finished()
