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

import numbers
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidOptionError, NonFiniteActivationError
from .drafts import Drafter, DraftState, NgramIndex, match_keys
from .events import DeltaEvent, LogprobDelta, TurnComplete
from .logprobs import MAX_TOP_LOGPROBS, token_logprob
from .prompt import TOOL_CALL_OPEN, continuation_ids, turn_prefix_ids
from .sampling import SamplingConfig, choose_token, resolve_seed, softmax
from .segments import ANSWER, CALL, THINK, MarkerIds, SegmentParser
from .speculate import stepper
from .stops import check_stops
from .text_markers import TextMarkerParser, close_when_short, explicit_choice

NORMAL_TYPE, BYTE_TYPE = 0, 4  # tokenizer piece types that carry ordinary text


class Session(Protocol):
    """The model session interface (`model.session()`): an append-only KV cache. A session
    that also has exact `extend(ids)` / `rewind(n)` is decoded speculatively
    (`speculate.py`), with the same tokens."""

    position: int

    def prefill(self, ids: Sequence[int], logits: bool = True) -> np.ndarray | None: ...

    def step(self, token_id: int) -> np.ndarray: ...


class Matcher(Protocol):
    """A grammar matcher started right after `<tool_call>`."""

    def allowed_mask(self) -> np.ndarray: ...

    def advance(self, token_id: int) -> Any: ...

    def is_finished(self) -> bool: ...


class Constraint(Protocol):
    """Something that can start a fresh matcher for one tool call (e.g. a compiled grammar)."""

    def start(self) -> Matcher: ...


@dataclass(frozen=True)
class GenerationConfig:
    """Per-turn decoding options.

    `reasoning_budget`: free-phase tokens allowed before `<tool_call>` is forced (None: no
    budget; 0: force the call at once). `require_call`: forbid ending the turn without a call.
    `allow_call=False`: no tool call at all (text only). `stop`: up to 4 stop sequences for
    the answer text. `logprobs`: None, or how many alternatives (0-20) to report with each
    answer-text token's log probability. `speculate`: verify prompt-lookup and grammar
    drafts in one pass where the session supports it exactly (`speculate.py`; the tokens
    are the same either way).
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 512
    reasoning_budget: int | None = 256
    require_call: bool = False
    allow_call: bool = True
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    speculate: bool = True
    call_threshold: float | None = None  # text-marker formats: `text_markers.explicit_choice`

    def __post_init__(self) -> None:
        if not isinstance(self.speculate, bool):
            raise InvalidOptionError(f"speculate must be true or false, got {self.speculate!r}")
        _count("max_new_tokens", self.max_new_tokens, 1)
        if self.reasoning_budget is not None:
            _count("reasoning_budget", self.reasoning_budget, 0, "or None (no budget)")
        object.__setattr__(self, "stop", check_stops(self.stop))
        if self.logprobs is not None:
            _count("logprobs", self.logprobs, 0, f"<= {MAX_TOP_LOGPROBS} (alternatives per "
                   "token), or None (off)", high=MAX_TOP_LOGPROBS)
        if self.require_call and not self.allow_call:
            raise InvalidOptionError("require_call and allow_call=False contradict each other")
        t = self.call_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real)
                              or not 0.0 <= t <= 1.0):
            raise InvalidOptionError(f"call_threshold must be a probability in [0, 1] or None, "
                                     f"got {t!r}")


def _count(name: str, value: Any, low: int, more: str = "", high: int | None = None) -> None:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        rule = f"an integer >= {low}" + (f" {more}" if more else "")
        raise InvalidOptionError(f"{name} must be {rule}, got {value!r}")


@dataclass(frozen=True)
class TurnVocab:
    """What the generator needs from the tokenizer, computed once per tokenizer."""

    token_bytes: list[bytes]
    markers: MarkerIds
    free_mask: np.ndarray  # bool[vocab]: tokens the free phase may emit
    call_prefix: tuple[int, ...]  # ids that open an answer with `<tool_call>` (dummy prefix)
    think_close_ids: tuple[int, ...]  # `\n</think>\n` as continuation ids
    match_keys: np.ndarray | None = None  # prompt-lookup match key per id (drafts.py)
    call_opening: tuple[int, ...] = ()  # `▁<tool_call>[{"name":"`: the opening draft
    # (open, close) when the call markers are text, not single tokens (`text_markers.py`):
    # the markers' ids above are then -1 and a whole-answer grammar decides calls
    text_markers: tuple[str, str] | None = None
    call_body: str = "list"  # "object": one call per marker pair (`text_markers.py`)
    call_start: np.ndarray | None = None  # bool[vocab]: tokens that begin the text marker
    closing: np.ndarray | None = None  # bool[vocab]: tokens that close a call (text_markers)

    def parser(self, stops: tuple[str, ...]) -> SegmentParser:
        """A fresh splitter of one answer's tokens."""
        if self.text_markers is None:
            return SegmentParser(self.token_bytes, self.markers, stops=stops)
        return TextMarkerParser(self.token_bytes, self.markers, strip_dummy_space=False,
                                stops=stops, call_open=self.text_markers[0],
                                call_close=self.text_markers[1], body=self.call_body)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TurnVocab:
        markers = MarkerIds.from_tokenizer(tokenizer)
        types = np.asarray(tokenizer.types)
        free = (types == NORMAL_TYPE) | (types == BYTE_TYPE)
        for token in (markers.think_open, markers.think_close, markers.tool_call_open,
                      markers.im_end, markers.eos):
            free[token] = True
        return cls(
            token_bytes=tokenizer.all_token_bytes(),
            markers=markers,
            free_mask=free,
            call_prefix=tuple(turn_prefix_ids(tokenizer, TOOL_CALL_OPEN)),
            think_close_ids=tuple(continuation_ids(tokenizer, "\n</think>\n")),
            match_keys=match_keys(tokenizer.all_token_bytes()),
            call_opening=tuple(turn_prefix_ids(tokenizer, TOOL_CALL_OPEN + '[{"name":"')),
        )


@dataclass
class TurnResult:
    """One decoded assistant turn."""

    tokens: list[int]  # every generated or forced token, stop token included
    reasoning: str
    text: str
    call_text: str | None  # JSON between `<tool_call>` and `</tool_call>`, None if no call
    call_closed: bool
    stop_reason: str  # "end" (im_end / grammar done), "eos", "length", "stop" (sequence)
    call_token_probs: list[float]
    forced_call: bool
    seed: int
    prefill_tokens: int
    prefill_s: float
    decode_s: float
    pending: list[int]  # tokens generated but not yet fed to the session
    logprobs: list[dict[str, Any]] | None = None  # per answer-text token, when requested
    first_token_prob: float | None = None  # first sampled token, unmasked (api/envelope.py)
    # forward passes after the prefill, and the drafts per source (`speculate.py`):
    # {"decode_passes", "lookup_drafted", "lookup_accepted", "grammar_drafted", ...}
    speculation: dict[str, int] = field(default_factory=dict)

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens)

    @property
    def decode_passes(self) -> int:
        return self.speculation.get("decode_passes", 0)


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


def generate_turn(
    session: Session,
    vocab: TurnVocab,
    prompt: Sequence[int],
    config: GenerationConfig,
    constraint: Constraint | None = None,
    *,
    context_limit: int | None = None,
    content: Constraint | None = None,
) -> Iterator[DeltaEvent | LogprobDelta | TurnComplete]:
    """Prefill `prompt` (only the last position's logits are computed), then decode one turn,
    yielding deltas as tokens are decoded and finally a `TurnComplete`. `constraint` masks
    the call after `<tool_call>`; `content` (if given) masks the answer from its first token."""
    seed = resolve_seed(config.sampling.seed)
    m = vocab.markers
    parser = vocab.parser(config.stop)
    tokens: list[int] = []
    probs_in_call: list[float] = []
    first_prob: float | None = None
    logprobs: list[dict[str, Any]] | None = [] if config.logprobs is not None else None
    matcher: Matcher | None = None
    answer: Matcher | None = content.start() if content is not None else None
    forced_call = False
    think_closed = False  # a text-only turn's budget closed the think block
    stop_reason = "length"
    limit = context_limit if context_limit is not None else 1 << 62

    def draft_state() -> DraftState:
        return DraftState(matcher if matcher is not None else answer,
                          free=parser.call is None and answer is None,
                          call_open=m.tool_call_open if config.allow_call else None,
                          constraint=constraint)

    feed = stepper(session, config.speculate,
                   lambda: Drafter(NgramIndex(vocab.match_keys), vocab.free_mask, m.stops),
                   draft_state, limit=context_limit, max_steps=config.max_new_tokens - 1,
                   opening=vocab.call_opening if config.allow_call else ())
    t0 = time.perf_counter()
    logits = checked(feed.prefill(list(prompt), logits=True), "prefill", feed.position)
    t1 = time.perf_counter()
    pending: list[int] = []

    def emit(token: int) -> list[DeltaEvent]:
        nonlocal matcher, answer
        tokens.append(token)
        events = parser.feed(token)
        if token == m.tool_call_open and parser.mode == CALL:
            answer = None  # a call replaces a constrained answer
            if constraint is not None:
                matcher = constraint.start()
        return events

    try:
        while len(tokens) < config.max_new_tokens:
            position = feed.position
            in_call = parser.mode == CALL
            budget_spent = (
                config.reasoning_budget is not None
                and answer is None
                and parser.call is None
                and len(tokens) >= config.reasoning_budget
                and (config.allow_call or (parser.mode == THINK and not think_closed))
            )
            chosen = False
            if budget_spent and not config.allow_call:
                # Text only: the budget ends the think block, then the answer runs free.
                forced = list(vocab.think_close_ids)
                think_closed = True
            elif budget_spent:
                forced = _forced_call_ids(vocab, parser, len(tokens))
                forced_call = True
            if budget_spent:
                for token in forced[:-1]:
                    yield from emit(token)
                    feed.step(token)
                token = forced[-1]
            else:
                if matcher is not None:
                    allowed = matcher.allowed_mask()
                elif answer is not None:
                    allowed = answer.allowed_mask()
                    if not tokens and config.call_threshold is not None and \
                            vocab.call_start is not None:
                        allowed = explicit_choice(allowed, logits, vocab.call_start,
                                                  config.call_threshold)
                    if vocab.closing is not None and parser.mode == CALL:
                        allowed = close_when_short(allowed, vocab.closing, config.max_new_tokens
                                                   - len(tokens), config.max_new_tokens)
                elif parser.call is None:
                    allowed = _free_mask(vocab, parser, config)
                else:
                    allowed = None
                token = choose_token(logits, config.sampling, position=position, seed=seed,
                                     allowed=allowed)
                if in_call:
                    probs_in_call.append(float(softmax(logits)[token]))
                elif first_prob is None:
                    first_prob = float(softmax(logits)[token])
                if matcher is not None:
                    matcher.advance(token)
                elif answer is not None:
                    answer.advance(token)
                chosen = True
            was_answer, leading = parser.mode == ANSWER, not parser.text
            yield from emit(token)
            if logprobs is not None and chosen and was_answer and parser.mode == ANSWER \
                    and token not in m.stops and token != m.think_open:
                entry = token_logprob(logits, token, vocab.token_bytes, config.logprobs or 0,
                                      leading)
                logprobs.append(entry)
                yield LogprobDelta(entry)
            if token in m.stops or (matcher is not None and matcher.is_finished()):
                stop_reason = "eos" if token == m.eos else "end"
                pending = [token]
                break
            if parser.stopped:
                stop_reason = "stop"
                pending = [token]
                break
            if feed.position + 1 >= limit or len(tokens) >= config.max_new_tokens:
                pending = [token]
                break
            logits = checked(feed.step(token), "decode step", feed.position)
    finally:
        feed.settle()  # undo draft tokens fed past the turn
    yield from parser.finish()
    t2 = time.perf_counter()
    result = TurnResult(
        tokens=tokens,
        reasoning="".join(parser.reasoning),
        text="".join(parser.text),
        call_text=parser.call_text,
        call_closed=parser.call_closed,
        stop_reason=stop_reason,
        call_token_probs=probs_in_call,
        forced_call=forced_call,
        seed=seed,
        prefill_tokens=len(prompt),
        prefill_s=t1 - t0,
        decode_s=t2 - t1,
        pending=pending,
        logprobs=logprobs,
        first_token_prob=first_prob,
        speculation=feed.stats(),
    )
    yield TurnComplete(result)


def run_turn(*args: Any, **kwargs: Any) -> TurnResult:
    """`generate_turn` without streaming: the finished `TurnResult`."""
    for event in generate_turn(*args, **kwargs):
        if isinstance(event, TurnComplete):
            return event.result
    raise AssertionError("generate_turn ended without TurnComplete")  # pragma: no cover
