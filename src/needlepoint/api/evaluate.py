"""Exact-match evaluation on a JSONL of `{"query", "tools", "answers"}` examples.

A prediction is right when its parsed calls equal `answers`: same calls, same order, same
argument values (a malformed or missing call block is wrong; `[]` matches `[]`). Decoding is
greedy, stops at `<|im_end|>`/EOS or `max_new_tokens`, with no system turn (as the toy model
was trained). The prompt is the model's chat format's (`formats/chat_format.py`); a template
model decodes under its whole-answer grammar (`generation/answer_grammar.py`). Each example's
prompt is prefilled once; every decoding mode (grammar on, off)
continues from a fork of that state when the session can fork.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import NeedlepointError
from ..generation import answer_grammar
from ..generation.draft_policy import policy_for
from ..generation.grammar import TokenVocab, ToolCallGrammar
from ..generation.syntaxes import syntax_for
from ..generation.turn import run_turn
from ..generation.turn_config import GenerationConfig, TurnVocab
from ..models.protocol import ModelProtocol
from .envelope import turn_envelope

MODES = ("grammar", "free")


@dataclass
class ModeScore:
    """Exact-match counts of one decoding mode, overall and by number of expected calls."""

    correct: int = 0
    total: int = 0
    by_calls: dict[int, list[int]] = field(default_factory=dict)  # n -> [correct, total]
    malformed: int = 0
    decode_tokens: int = 0
    seconds: float = 0.0

    def add(self, right: bool, expected_calls: int, malformed: bool) -> None:
        self.correct += right
        self.total += 1
        self.malformed += malformed
        tally = self.by_calls.setdefault(expected_calls, [0, 0])
        tally[0] += right
        tally[1] += 1

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"correct": self.correct, "total": self.total, "accuracy": self.accuracy,
                "malformed": self.malformed,
                "by_expected_calls": {str(n): {"correct": c, "total": t}
                                      for n, (c, t) in sorted(self.by_calls.items())},
                "decode_tokens": self.decode_tokens, "seconds": self.seconds}


class EvalDataError(NeedlepointError, ValueError):
    """An eval file that is not JSONL of `{query, tools, answers}` objects (names the line)."""


def load_examples(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The examples of a JSONL file (blank lines skipped); EvalDataError names a bad line."""
    examples = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            where = f"{os.fspath(path)}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise EvalDataError(f"{where}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                example = json.loads(line)
            except json.JSONDecodeError as error:
                raise EvalDataError(f"{where}: not JSON ({error.msg}); an eval file is JSONL, "
                                    "one {query, tools, answers} object a line") from None
            if not isinstance(example, dict):
                raise EvalDataError(f"{where}: expected a {{query, tools, answers}} object, "
                                    f"got {type(example).__name__}")
            missing = {"query", "tools", "answers"} - set(example)
            if missing:
                raise EvalDataError(f"{where}: missing {sorted(missing)}; each line needs "
                                    "query, tools and answers")
            if not isinstance(example["query"], str) or not isinstance(example["tools"], list) \
                    or not isinstance(example["answers"], list):
                raise EvalDataError(f"{where}: query must be a string, tools and answers lists")
            examples.append(example)
    return examples


def exact_match(predicted: Sequence[dict[str, Any]] | None, answers: Sequence[dict]) -> bool:
    """Same calls, same order, same argument values."""
    if predicted is None:
        return False
    normal = [{"name": a["name"], "arguments": a.get("arguments", {})} for a in answers]
    return list(predicted) == normal


class Evaluator:
    """Decodes examples on one model; the tokenizer-derived tables are built once."""

    def __init__(
        self, model: ModelProtocol, *, max_new_tokens: int = 80, modes: Iterable[str] = MODES,
        speculate: bool = True, require_call: bool = False,
    ):
        self.model = model
        self.modes = tuple(modes)
        unknown = set(self.modes) - set(MODES)
        if unknown:
            raise ValueError(f"unknown eval modes {sorted(unknown)}; choose from {MODES}")
        tokenizer = model.tokenizer
        self.tokenizer = tokenizer
        self.format = model.chat_format
        self.syntax = syntax_for(self.format)  # a template model's (answer_grammar.py)
        self.whole_answer = self.syntax is not None
        if self.syntax is not None:
            self.vocab = answer_grammar.turn_vocab(self.format, self.syntax)
            self.grammar_vocab = answer_grammar.token_vocab(self.format, self.syntax)
        else:
            self.vocab = TurnVocab.from_tokenizer(tokenizer)
            self.grammar_vocab = TokenVocab.from_tokenizer(tokenizer) \
                if "grammar" in self.modes else None
        # `require_call`: OpenAI's tool_choice "required" (a call in every answer); else auto,
        # where a template model calls or answers as it chooses (generation/route.py)
        self.require_call = require_call
        self.config = GenerationConfig(
            max_new_tokens=max_new_tokens, reasoning_budget=None, speculate=speculate,
            call_threshold=answer_grammar.AUTO_CALL_THRESHOLD if self.whole_answer else None,
            require_call=require_call)
        self.scores = {mode: ModeScore() for mode in self.modes}
        self.limit = int(model.config.max_seq_len)
        self.policy = policy_for(model)

    def predict(self, example: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each mode's envelope for one example."""
        if self.syntax is not None:
            self.syntax.check_tools(example["tools"])
        ids = self.format.first_ids(example["tools"], example["query"])
        base = self.model.session()
        can_fork = base.capabilities.fork
        if can_fork:
            base.prefill(ids[:-1], logits=False)
        envelopes = {}
        for mode in self.modes:
            if can_fork:
                session, feed = base.fork(), ids[-1:]
            else:
                session, feed = self.model.session(), ids
            grammar = content = None
            if mode == "grammar" and self.whole_answer:
                content = answer_grammar.AnswerGrammar(
                    self.grammar_vocab, self.format, example["tools"], syntax=self.syntax,
                    text=not self.require_call, require_call=self.require_call)
            elif mode == "grammar":
                grammar = ToolCallGrammar(self.grammar_vocab, example["tools"])
            config = self.config if mode == "grammar" else replace(self.config,
                                                                   require_call=False)
            result = run_turn(session, self.vocab, feed, config, grammar,
                              context_limit=self.limit, content=content, policy=self.policy)
            envelope = turn_envelope(
                result, text_call_tools=None if content is None else content.text_call_tools)
            envelope["timings"]["prefill_tokens"] = len(ids)
            envelopes[mode] = envelope
        return envelopes

    def score(self, example: dict[str, Any]) -> dict[str, bool]:
        """Decode one example, add it to the scores, return whether each mode got it right."""
        outcome = {}
        for mode, envelope in self.predict(example).items():
            calls = None if "error" in envelope else envelope["function_calls"]
            right = exact_match(calls, example["answers"])
            score = self.scores[mode]
            score.add(right, len(example["answers"]), "error" in envelope)
            score.decode_tokens += envelope["timings"]["decode_tokens"]
            score.seconds += envelope["timings"]["total_s"]
            outcome[mode] = right
        return outcome


def evaluate(
    model: Any,
    examples: Iterable[dict[str, Any]],
    *,
    max_new_tokens: int = 80,
    modes: Iterable[str] = MODES,
    on_example: Callable[[int, dict[str, bool]], None] | None = None,
    speculate: bool = True,
    require_call: bool = False,
) -> dict[str, ModeScore]:
    """Score every example in every mode; `on_example(index, outcome)` after each one;
    `speculate`: speculative decoding (the same tokens, fewer passes); `require_call`: a call
    in every answer (tool_choice "required")."""
    evaluator = Evaluator(model, max_new_tokens=max_new_tokens, modes=modes,
                          speculate=speculate, require_call=require_call)
    for index, example in enumerate(examples):
        outcome = evaluator.score(example)
        if on_example is not None:
            on_example(index, outcome)
    return evaluator.scores
