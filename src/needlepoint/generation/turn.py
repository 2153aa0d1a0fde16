"""Decoding one assistant turn on a model session: free reasoning, then a constrained call.

Phases of a turn (each optional except the stop):

1. free: the model writes `<think>...</think>` and/or plain text. The free-phase mask allows
   ordinary text pieces, the think markers (in a sensible order), `<tool_call>`, and, unless
   a call is required, `<|im_end|>`/EOS (a plain "respond" turn). Other chat markers (role
   markers, `<tool_result>`, ...) are never something an answer may write.
2. call: once `<tool_call>` is emitted (or forced, when the reasoning budget runs out) the
   grammar's matcher masks every step (disallowed logits to -inf before greedy/sampling)
   through the JSON array, `</tool_call>` and `<|im_end|>`. Without a grammar the call runs
   free until `<|im_end|>`/EOS.
3. stop: at `<|im_end|>`, EOS, the grammar finishing, a stop sequence in the answer text,
   `max_new_tokens`, or the context limit.

Options beside those: `allow_call=False` masks `<tool_call>` (a text-only turn: OpenAI
`tool_choice="none"`); a reasoning budget then only closes a `<think>` block. A `content`
constraint (response_format) masks the answer from its first token: JSON, or a tool call.
Logits that are not finite (NaN/inf: corrupt weights) raise `NonFiniteActivationError`
instead of decoding garbage.

The stop token is *not* fed to the session (no logits are needed after it); it comes back as
`TurnResult.pending` and the next turn's prefill starts with it, so a multi-turn conversation
reuses the cache instead of recomputing it.

Call confidence: for every token chosen inside `<tool_call>...</tool_call>` (closing marker
included) we record its probability under the model's own *unmasked* distribution (softmax of
the raw logits, temperature 1). A grammar that forces a token the model did not want then
shows up as low confidence instead of being hidden by renormalisation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import NonFiniteActivationError
from ..models.protocol import SessionProtocol
from .decisions import BETWEEN, CallCursor, DecisionLog, choice_probability, route_probability
from .decisions import CALL as CALL_DECISION
from .draft_policy import DraftPolicy
from .drafts import Drafter, DraftState, NgramIndex
from .events import DeltaEvent, LogprobDelta, ToolCallDelta, TurnComplete
from .logprobs import token_logprob
from .marker_tokens import after_close, between_calls, close_choice
from .route import route
from .sampling import choose_token, resolve_seed, softmax
from .segments import AFTER_CALL, ANSWER, CALL, THINK, SegmentParser
from .speculate import PlainStepper, stepper
from .text_markers import close_when_short, end_when_short
from .turn_config import Constraint, GenerationConfig, Matcher, TurnVocab
from .turn_result import TurnResult

__all__ = ["Constraint", "GenerationConfig", "Matcher", "TurnResult", "TurnVocab", "checked",
           "generate_turn", "run_turn"]


def _free_mask(vocab: TurnVocab, parser: SegmentParser, config: GenerationConfig) -> np.ndarray:
    mask = vocab.free_mask.copy()
    m = vocab.markers
    if vocab.text_markers is None:
        mask[m.think_open] = parser.mode != THINK and not parser.reasoning and not parser.text
        mask[m.think_close] = parser.mode == THINK
        if not config.allow_call:
            mask[m.tool_call_open] = False
    if config.require_call:
        mask[m.im_end] = mask[m.eos] = False
    return mask


def checked(logits: np.ndarray | None, where: str, position: int) -> np.ndarray:
    """`logits`, or NonFiniteActivationError when any is NaN or infinite (corrupt weights:
    decoding on would only sample garbage from a broken distribution)."""
    if logits is None:
        raise NonFiniteActivationError(f"the model returned no logits from {where}")
    values = np.asarray(logits)
    if not np.isfinite(values).all():
        bad = int(np.count_nonzero(~np.isfinite(values)))
        raise NonFiniteActivationError(
            f"the model computed {bad} non-finite logits (NaN or inf) at position {position} "
            f"({where}): the weights are likely corrupt; check the archive with "
            "`needlepoint inspect --verify MODEL.cact`")
    return values


def _forced_call_ids(vocab: TurnVocab, parser: SegmentParser, generated: int) -> list[int]:
    """Tokens that force `<tool_call>` from the current free-phase state."""
    if parser.mode == THINK:
        return [*vocab.think_close_ids, vocab.markers.tool_call_open]
    if generated == 0:
        return list(vocab.call_prefix)
    return [vocab.markers.tool_call_open]


@dataclass
class TurnState:
    """One turn while it is decoded: the splitter, the grammar matchers, the tokens so far
    and what the result will report. `generate_turn` is its steps in order: `budget_spent`
    / `forced_tokens` (the reasoning budget), `pick` (mask, then sample), `accept` (split
    the token into events, log probabilities), `finished` (the stop conditions)."""

    vocab: TurnVocab
    config: GenerationConfig
    constraint: Constraint | None
    parser: SegmentParser
    answer: Matcher | None  # the content constraint's matcher (response_format)
    seed: int
    matcher: Matcher | None = None  # the call grammar's, once `<tool_call>` is written
    tokens: list[int] = field(default_factory=list)
    probs_in_call: list[float] = field(default_factory=list)
    first_prob: float | None = None  # the first sampled token's, unmasked (api/envelope.py)
    logprobs: list[dict[str, Any]] | None = None
    forced_call: bool = False
    think_closed: bool = False  # a text-only turn's budget closed the think block
    stop_reason: str = "length"
    pending: list[int] = field(default_factory=list)
    block_start: int | None = None  # where the call block being written began (its token)
    longest_block: int = 0  # tokens of the longest call block so far (`end_when_short`)
    log: DecisionLog = field(default_factory=DecisionLog)  # the confidence's evidence
    cursor: CallCursor = field(default_factory=CallCursor)  # which call the JSON is in
    close: str | None = None  # the choice at the last closing marker (marker_tokens.py)

    @classmethod
    def start(cls, vocab: TurnVocab, config: GenerationConfig, constraint: Constraint | None,
              content: Constraint | None) -> TurnState:
        return cls(vocab, config, constraint, vocab.parser(config.stop),
                   content.start() if content is not None else None,
                   resolve_seed(config.sampling.seed),
                   logprobs=[] if config.logprobs is not None else None)

    def draft_state(self) -> DraftState:
        """Where the turn is, for a speculative draft (`speculate.py`)."""
        markers = self.vocab.markers
        return DraftState(self.matcher if self.matcher is not None else self.answer,
                          free=self.parser.call is None and self.answer is None,
                          call_open=markers.tool_call_open if self.config.allow_call else None,
                          constraint=self.constraint)

    def emit(self, token: int) -> list[DeltaEvent]:
        """Record `token` and split it into events; `<tool_call>` starts the call grammar."""
        self.tokens.append(token)
        before = self.parser.mode
        events = self.parser.feed(token)
        for event in events:
            if isinstance(event, ToolCallDelta):
                self.cursor.feed(event.text)
        self._measure_block(before)
        if token == self.vocab.markers.tool_call_open and self.parser.mode == CALL:
            self.answer = None  # a call replaces a constrained answer
            if self.constraint is not None:
                self.matcher = self.constraint.start()
        return events

    def _measure_block(self, before: str) -> None:
        """Count the tokens of each call block, from the token that opened it to the one that
        closed it."""
        mode = self.parser.mode
        if mode == CALL and before != CALL:
            self.block_start = len(self.tokens) - 1
        elif before == CALL and mode != CALL and self.block_start is not None:
            self.longest_block = max(self.longest_block, len(self.tokens) - self.block_start)
            self.block_start = None

    def budget_spent(self) -> bool:
        """Whether the reasoning budget ends the free phase now."""
        config, parser = self.config, self.parser
        return (config.reasoning_budget is not None and self.answer is None
                and parser.call is None and len(self.tokens) >= config.reasoning_budget
                and (config.allow_call or (parser.mode == THINK and not self.think_closed)))

    def forced_tokens(self) -> list[int]:
        """What a spent budget forces: the call opening, or (text only) the end of the think
        block, after which the answer runs free."""
        if not self.config.allow_call:
            self.think_closed = True
            return list(self.vocab.think_close_ids)
        self.forced_call = True
        return _forced_call_ids(self.vocab, self.parser, len(self.tokens))

    def allowed(self, logits: np.ndarray) -> np.ndarray | None:
        """The mask of the next token: the call grammar, the content grammar (with a
        template model's call/answer choice and closing a call before the budget ends),
        the free phase's, or none (a call without a grammar)."""
        vocab, config, parser = self.vocab, self.config, self.parser
        if self.matcher is not None:
            return self.matcher.allowed_mask()
        if self.answer is not None:
            allowed = self.answer.allowed_mask()
            remaining = config.max_new_tokens - len(self.tokens)
            if vocab.closing is not None and parser.mode == CALL:
                allowed = close_when_short(allowed, vocab.closing, remaining,
                                           config.max_new_tokens)
            elif vocab.closing is not None and parser.call is not None:  # a block closed
                allowed = end_when_short(allowed, vocab.markers.stops, remaining,
                                         config.max_new_tokens, self.longest_block)
            if self.close is not None and parser.mode != CALL and parser.call is not None \
                    and self.cursor.call is None:  # after a marker where the choice was made
                allowed = after_close(between_calls(allowed, vocab.marker_pieces),
                                      vocab.markers.stops, self.close)
            return allowed
        if parser.call is None:
            return _free_mask(vocab, parser, config)
        return None

    def pick(self, logits: np.ndarray, position: int) -> int:
        """Choose the next token under the mask (its unmasked probability counts toward the
        call's confidence) and advance the grammar with it."""
        in_call = self.parser.mode == CALL
        allowed = self.allowed(logits)

        def choose(mask: np.ndarray | None) -> int:
            return choose_token(logits, self.config.sampling, position=position,
                                seed=self.seed, allowed=mask)

        if self.routing():
            token, prob = route(logits, allowed, self.vocab.call_start, self.vocab.fence_start,
                                self.config.call_threshold, choose)
            if prob is not None:
                self.log.route(prob)
        else:
            if self.closing(allowed):
                vocab = self.vocab
                self.close, share = close_choice(logits, vocab.call_marker_ids[1],
                                                 vocab.call_starts, vocab.markers.stops)
                if self.close is not None:  # the marker as its own token, then the choice
                    allowed = between_calls(allowed, vocab.marker_pieces)
                    self.log.choose(BETWEEN, None, share)
            token = choose(allowed)
            self.record(logits, allowed, token)
        if in_call:
            self.probs_in_call.append(float(softmax(logits)[token]))
        elif self.first_prob is None:
            self.first_prob = float(softmax(logits)[token])
        if self.matcher is not None:
            self.matcher.advance(token)
        elif self.answer is not None:
            self.answer.advance(token)
        return token

    def closing(self, allowed: np.ndarray | None) -> bool:
        """Whether this is a call's closing-marker position in an answer that must call,
        where another call or the end is decided (`marker_tokens.close_choice`)."""
        close = self.vocab.call_marker_ids[1]
        return (self.config.require_call and close >= 0 and allowed is not None
                and self.vocab.call_starts is not None and self.answer is not None
                and self.vocab.marker_pieces is not None
                and self.parser.mode == CALL and self.cursor.call is None
                and bool(allowed[close]))

    def routing(self) -> bool:
        """Whether this token is a template model's call-or-answer choice (`route.py`): the
        answer's first, under the whole-answer grammar, calls allowed."""
        return (not self.tokens and self.answer is not None and self.config.allow_call
                and self.vocab.call_start is not None)

    def record(self, logits: np.ndarray, allowed: np.ndarray | None, token: int) -> None:
        """The chosen token as evidence (`decisions.py`): the route between a call and text
        while neither has begun (Needle's `<tool_call>` token; a template model's route is
        recorded by `pick`), then the tokens inside and between the calls."""
        parser, log = self.parser, self.log
        if not log.routed and parser.call is None and parser.mode == ANSWER \
                and not parser.text and self.config.allow_call and allowed is not None \
                and self.vocab.call_start is None:
            side = np.zeros(len(self.vocab.token_bytes), bool)
            side[self.vocab.markers.tool_call_open] = True
            prob = route_probability(logits, allowed, side, token)
            if prob is not None:
                log.route(prob)
                return
        if parser.mode == CALL:
            index = self.cursor.call
            kind = CALL_DECISION if index is not None else BETWEEN
        elif parser.mode == AFTER_CALL and parser.call is not None:
            kind, index = BETWEEN, None
        else:
            log.forced()  # text or reasoning: no evidence
            return
        q, alternatives = choice_probability(logits, allowed, token)
        if alternatives <= 1:
            log.forced()
        else:
            log.choose(kind, index, q)

    def accept(self, token: int, logits: np.ndarray, chosen: bool
               ) -> Iterator[DeltaEvent | LogprobDelta]:
        """The events of `token`, then its log probability when asked for (answer text the
        model chose, not forced tokens or markers)."""
        was_answer, leading = self.parser.mode == ANSWER, not self.parser.text
        yield from self.emit(token)
        markers = self.vocab.markers
        if self.logprobs is not None and chosen and was_answer and \
                self.parser.mode == ANSWER and token not in markers.stops and \
                token != markers.think_open:
            entry = token_logprob(logits, token, self.vocab.token_bytes,
                                  self.config.logprobs or 0, leading)
            self.logprobs.append(entry)
            yield LogprobDelta(entry)

    def finished(self, token: int, position: int, limit: int) -> bool:
        """Whether the turn ends after `token`: a stop token or the grammar done ("end",
        "eos"), a call identical to an earlier one finished ("repeat"), a stop sequence
        ("stop"), the context or `max_new_tokens` ("length"). The
        last token is then left unfed (`pending`)."""
        markers = self.vocab.markers
        if token in markers.stops or (self.matcher is not None and self.matcher.is_finished()):
            self.stop_reason = "eos" if token == markers.eos else "end"
        elif self.cursor.repeated:
            self.stop_reason = "repeat"  # the same call again: the answer is the calls made
        elif self.parser.stopped:
            self.stop_reason = "stop"
        elif not (position + 1 >= limit or len(self.tokens) >= self.config.max_new_tokens):
            return False
        self.pending = [token]
        return True

    def result(self, prompt_tokens: int, prefill_s: float, decode_s: float,
               speculation: dict[str, int]) -> TurnResult:
        parser = self.parser
        return TurnResult(
            tokens=self.tokens, reasoning="".join(parser.reasoning), text="".join(parser.text),
            call_text=parser.call_text, call_closed=parser.call_closed,
            stop_reason=self.stop_reason, call_token_probs=self.probs_in_call,
            forced_call=self.forced_call, seed=self.seed, prefill_tokens=prompt_tokens,
            prefill_s=prefill_s, decode_s=decode_s, pending=self.pending,
            logprobs=self.logprobs, first_token_prob=self.first_prob,
            speculation=speculation, decisions=self.log.decisions)


def _feed(session: SessionProtocol, turn: TurnState, context_limit: int | None,
          policy: DraftPolicy | None) -> PlainStepper:
    """The session as the turn steps it: through speculative drafts when asked for and the
    session's capabilities allow it exactly (`speculate.py`), else plain steps."""
    vocab, config = turn.vocab, turn.config
    return stepper(session, config.speculate,
                   lambda: Drafter(NgramIndex(vocab.match_keys), vocab.free_mask,
                                   vocab.markers.stops),
                   turn.draft_state, limit=context_limit, max_steps=config.max_new_tokens - 1,
                   opening=vocab.call_opening if config.allow_call else (), policy=policy)


def generate_turn(
    session: SessionProtocol,
    vocab: TurnVocab,
    prompt: Sequence[int],
    config: GenerationConfig,
    constraint: Constraint | None = None,
    *,
    context_limit: int | None = None,
    content: Constraint | None = None,
    policy: DraftPolicy | None = None,
) -> Iterator[DeltaEvent | LogprobDelta | TurnComplete]:
    """Prefill `prompt` (only the last position's logits are computed), then decode one turn,
    yielding deltas as tokens are decoded and finally a `TurnComplete`. `constraint` masks
    the call after `<tool_call>`; `content` (if given) masks the answer from its first token;
    `policy` is the draft policy learnt for the session's model (`draft_policy.policy_for`)."""
    turn = TurnState.start(vocab, config, constraint, content)
    limit = context_limit if context_limit is not None else 1 << 62
    feed = _feed(session, turn, context_limit, policy)
    t0 = time.perf_counter()
    logits = checked(feed.prefill(list(prompt), logits=True), "prefill", feed.position)
    t1 = time.perf_counter()
    try:
        while len(turn.tokens) < config.max_new_tokens:
            if turn.budget_spent():
                forced = turn.forced_tokens()
                turn.log.forced()
                for token in forced[:-1]:
                    yield from turn.emit(token)
                    feed.step(token)
                token, chosen = forced[-1], False
            else:
                token, chosen = turn.pick(logits, feed.position), True
            yield from turn.accept(token, logits, chosen)
            if turn.finished(token, feed.position, limit):
                break
            logits = checked(feed.step(token), "decode step", feed.position)
    finally:
        feed.settle()  # undo draft tokens fed past the turn
    yield from turn.parser.finish()
    yield TurnComplete(turn.result(len(prompt), t1 - t0, time.perf_counter() - t1,
                                   feed.stats()))


def run_turn(*args: Any, **kwargs: Any) -> TurnResult:
    """`generate_turn` without streaming: the finished `TurnResult`."""
    for event in generate_turn(*args, **kwargs):
        if isinstance(event, TurnComplete):
            return event.result
    raise AssertionError("generate_turn ended without TurnComplete")  # pragma: no cover
