"""A template model that calls the same tool again and again (qwen3-tiny's own weights do,
with `tool_choice="required"`): near the end of the token budget the answer
ends with the call blocks it has (`text_markers.end_when_short`) instead of opening one more
that the budget cuts off unparseable. One call object per marker pair (Qwen's `<tool_call>`
blocks, FunctionGemma's `<start_function_call>` blocks), over the fixtures' own tokenizers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_model import LogitSession
from hf_helpers import hf_reference

from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.generation.answer_grammar import AnswerGrammar, token_vocab, turn_vocab
from needlepoint.generation.syntaxes import syntax_for
from needlepoint.generation.text_markers import CLOSE_RESERVE, end_when_short
from needlepoint.generation.turn import run_turn
from needlepoint.generation.turn_config import GenerationConfig

TOOLS = [
    {"name": "set_alarm", "description": "Set an alarm.", "parameters": {
        "type": "object", "properties": {"time": {"type": "string", "enum": ["06:45", "7"]},
                                         "loud": {"type": "boolean"}},
        "required": ["time"]}},
    {"name": "call_contact", "description": "Phone a contact.",
     "parameters": {"type": "object", "properties": {
        "contact": {"enum": ["Ana", "Bo", None]}}, "required": ["contact"]}},
]


class LoopingSession(LogitSession):
    """Logits that always favour opening another call block and never the end of the turn
    (deterministic noise elsewhere, keyed by position)."""

    def __init__(self, vocab: int, favoured: list[int], ends: list[int]) -> None:
        super().__init__()
        self.vocab, self.favoured, self.ends = vocab, favoured, ends

    def _logits(self) -> np.ndarray:
        logits = np.random.default_rng(len(self.ids)).normal(0, 1, self.vocab)
        logits[self.favoured] += 12.0
        logits[self.ends] -= 12.0
        return logits.astype(np.float32)


def test_end_when_short_keeps_only_the_end_once_a_block_would_not_fit() -> None:
    allowed = np.array([True, True, False, True])  # another block's start, text, -, the end
    assert end_when_short(allowed, [3], CLOSE_RESERVE + 21, block=20) is allowed
    assert end_when_short(allowed, [3], CLOSE_RESERVE + 20, block=20).tolist() == \
        [False, False, False, True]
    assert end_when_short(allowed, [2], 5) is allowed  # the end not allowed yet: unchanged
    # a small budget keeps a quarter of itself, plus the block
    assert end_when_short(allowed, [3], 23, budget=48, block=10) is allowed
    assert end_when_short(allowed, [3], 22, budget=48, block=10).tolist() == \
        [False, False, False, True]


@pytest.mark.parametrize(("name", "kwargs"), [("qwen3-tiny", {"enable_thinking": False}),
                                              ("qwen2-tiny", None), ("gemma3-tiny", None)])
def test_a_looping_model_ends_with_complete_calls_at_every_budget(name, kwargs) -> None:
    tokenizer = open_hf_directory(hf_reference(name).folder).tokenizer
    fmt = TemplateFormat(tokenizer, template_kwargs=kwargs)
    syntax = syntax_for(fmt)
    assert syntax.body == "object"
    markers = tokenizer.markers
    separator = syntax.layout.separator if syntax.name == "qwen" else ""
    favoured = [markers[syntax.open], *tokenizer.encode(separator, add_special_tokens=False)]
    vocab = turn_vocab(fmt)
    grammar = AnswerGrammar(token_vocab(fmt), fmt, TOOLS, text=False, require_call=True)
    prompt = fmt.first_ids(TOOLS, "Wake me at 6:45 tomorrow, then call Ana.")
    counts = []
    for budget in range(40, 161, 6):
        session = LoopingSession(len(vocab.token_bytes), favoured, list(fmt.end_ids))
        config = GenerationConfig(max_new_tokens=budget, require_call=True,
                                  reasoning_budget=None, speculate=False)
        result = run_turn(session, vocab, prompt, config, content=grammar)
        assert result.stop_reason in ("end", "eos"), (budget, result.call_text)
        assert result.call_closed and len(result.tokens) <= budget
        calls = json.loads(result.call_text)
        assert calls and all(c["name"] in {t["name"] for t in TOOLS} for c in calls)
        counts.append(len(calls))
    assert max(counts) > 2 and counts == sorted(counts)  # more room, more calls
