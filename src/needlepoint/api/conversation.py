"""One conversation on one model session: turns appended to a single KV cache.

The first turn prefills `[BOS] + prompt`; each later turn prefills only what is new (the
previous turn's unfed stop token, then the next user turn), so earlier tokens are never
recomputed. The confidence head, when the archive has one, runs on the whole conversation so
far (prompt + generated turn) after each turn; without one the envelope's confidence is the
turn's token measure (`envelope.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..generation.answer_grammar import AnswerGrammar
from ..generation.draft_policy import policy_for
from ..generation.events import DeltaEvent, Done, TurnComplete
from ..generation.turn import generate_turn
from ..generation.turn_config import Constraint, GenerationConfig, TurnVocab
from ..generation.turn_result import TurnResult
from ..models.protocol import ModelProtocol
from .context import check_fits
from .envelope import turn_envelope

CUT_ANSWER = ("the answer was cut at max_new_tokens before its JSON was complete (stop_reason "
              "'length'): the text is not valid JSON; allow more tokens")


class Conversation:
    """Token history and session of one conversation. Not thread-safe (one per `Needle`)."""

    def __init__(self, model: ModelProtocol, vocab: TurnVocab, *,
                 kv_window: int | None = None) -> None:
        self.model = model
        self.policy = policy_for(model)  # speculative drafts learnt per model
        self.vocab = vocab
        self.kv_window = kv_window
        self.session = model.session(kv_window=kv_window)
        self.ids: list[int] = []  # every token of the conversation, fed or pending
        self.pending: list[int] = []  # generated but not yet fed to the session
        self.last_answer: list[int] = []  # the last turn's tokens, its stop token included
        self.turns = 0

    @property
    def position(self) -> int:
        """Tokens in the conversation so far, the unfed stop token included."""
        return len(self.ids)

    @property
    def context_limit(self) -> int:
        return int(self.model.config.max_seq_len)

    def resume(self, ids: Sequence[int]) -> list[int]:
        """Continue with the whole conversation `ids` (a re-rendered history): keep the
        longest prefix the session already consumed (rewinding past it where the session
        can, else starting a fresh session) and return the ids still to feed, at least one."""
        fed = self.ids[: len(self.ids) - len(self.pending)]
        ids = list(ids)
        common = 0
        for a, b in zip(fed, ids, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)
        if common < len(fed):
            if self.session.capabilities.rewind:
                self.session.rewind(len(fed) - common)
            else:
                self.session = self.model.session(kv_window=self.kv_window)
                common = 0
        self.ids, self.pending = ids[:common], []
        return ids[common:]

    def user_turn_ids(self, content: str) -> list[int]:
        """Ids that close the previous turn (its unfed stop token, as an `<|im_end|>`: an EOS
        stop or a cut-off turn is closed the same way) and open a user turn with `content`
        (Needle's format: `NeedleFormat.next_turn_ids`)."""
        if self.turns == 0:
            raise ValueError("the first turn needs a full prompt (tools and query)")
        return self.model.chat_format.next_turn_ids(self.pending, content)

    def turn(
        self,
        new_ids: Sequence[int],
        config: GenerationConfig,
        constraint: Constraint | None = None,
        *,
        content: Constraint | None = None,
        check_tools: Sequence[dict[str, Any]] | None = None,
        parallel_calls: bool = True,
    ) -> Iterator[DeltaEvent | Done]:
        """Feed `new_ids`, decode one assistant turn; stream deltas, then `Done(envelope)`.
        `content` constrains the answer text (response_format); `check_tools` validates the
        calls of a turn decoded without a grammar (see `turn_envelope`)."""
        check_fits(len(self.ids) - len(self.pending) + len(new_ids), self.context_limit,
                   self.turns == 0)
        # new_ids starts with the pending stop token (see `user_turn_ids`): count it once.
        del self.ids[len(self.ids) - len(self.pending) :]
        self.pending = []
        self.ids.extend(new_ids)
        result: TurnResult | None = None
        for event in generate_turn(self.session, self.vocab, new_ids, config, constraint,
                                   context_limit=self.context_limit, content=content,
                                   policy=self.policy):
            if isinstance(event, TurnComplete):
                result = event.result
            else:
                yield event
        assert result is not None
        self.ids.extend(result.tokens)
        self.last_answer = list(result.tokens)
        self.pending = list(result.pending)
        self.turns += 1
        head_logit, confidence_s = self.confidence_logit()
        envelope = turn_envelope(result, head_logit=head_logit, confidence_s=confidence_s,
                                 check_tools=check_tools, require_call=config.require_call,
                                 parallel_calls=parallel_calls,
                                 text_call_tools=_text_call_tools(content))
        if content is not None and result.stop_reason == "length" and \
                envelope["type"] == "respond":
            envelope["error"] = CUT_ANSWER  # the text is a prefix of the JSON, not the JSON
        envelope["seed"] = result.seed
        # forward passes after the prefill and the drafts per source (generation/speculate.py)
        envelope["timings"].update(result.speculation)
        yield Done(envelope)

    def confidence_logit(self) -> tuple[float | None, float]:
        """The confidence head's logit over the conversation so far (a trailing EOS left out),
        and the seconds it took; (None, 0) when the model has no head.

        A session that pools the head online (`fork` + `confidence_logit`) is forked and fed
        only the unfed stop token; otherwise the model recomputes it over all the ids."""
        if not self.model.capabilities.confidence_head:
            return None, 0.0
        eos = self.vocab.markers.eos
        start = time.perf_counter()
        caps = self.session.capabilities
        if caps.fork and caps.confidence:
            branch = self.session.fork()
            tail = [t for t in self.pending if t != eos]
            if tail:
                branch.prefill(tail, logits=False)
            logit = branch.confidence_logit()
        else:
            ids = self.ids[:-1] if self.ids and self.ids[-1] == eos else list(self.ids)
            logit = self.model.confidence_logit(ids)
        return (None if logit is None else float(logit)), time.perf_counter() - start


def _text_call_tools(content: Any) -> list[dict] | None:
    """The tools a text answer may still call in JSON (a whole-answer grammar's), or None."""
    return content.text_call_tools if isinstance(content, AnswerGrammar) else None
