"""Speculative decoding: drafts verified in one pass, the output unchanged.

The turn loop (`turn.py`) decodes exactly as without speculation: it asks for the logits
after each token it chose and picks the next one (greedy, or the position-keyed seeded draw
of `sampling.py`, so a pick never depends on how many tokens were drafted). What changes is
where the logits come from. `Speculator` stands in for the session:

* `step(token)` with no draft pending: it proposes a draft (`drafts.py`: prompt lookup and
  grammar fast-forward), runs `session.extend([token, *draft])` (one forward pass, the
  logits after every position) and returns the first row, keeping the others;
* `step(token)` when `token` is the next draft token: its row is returned at no cost (the
  model's own pick equalled the draft);
* `step(token)` when it is not: the rest of the draft is undone (`session.rewind(n)`) and a
  new pass starts from `token`.

So a pass yields the longest draft prefix the picks agree with plus the pick after it, and
the turn sees the same logits, hence the same tokens, events, log probabilities and
confidence as stepping one token at a time: `extend` is bit-identical to steps and `rewind`
exact in deploy numerics. `settle()` undoes what is left of a draft when the turn ends, so
the session holds exactly the tokens a plain decode would have fed.

Speculation needs a session with `extend` and `rewind` whose multi-position logits are the
steps' bits (`speculation_supported`); any other session (float numerics, transformer
models, the scheduler's proxies) decodes with plain steps through `PlainStepper`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import NonFiniteActivationError
from ..models.protocol import SessionProtocol
from .draft_policy import DraftPolicy
from .drafts import MAX_DRAFT, OPENING, SOURCES, Draft, Drafter, DraftState

LOOKUP_MAX = 16  # lookup tokens per draft, before the policy cuts it
SHORT_TAIL = 8  # a last prompt chunk this short carries the opening (its logits are cheap)


def speculation_supported(session: SessionProtocol) -> bool:
    """Whether `session` can verify drafts exactly: its capabilities (`models/protocol.py`)
    declare `extend` and `rewind` whose multi-position logits are the bits of single steps
    (`exact`: Needle 3 in deploy numerics, transformers in int8, their stages)."""
    caps = session.capabilities
    return caps.extend and caps.rewind and caps.exact


class PlainStepper:
    """A session as the turn loop uses it, one forward pass per step (counted)."""

    def __init__(self, session: SessionProtocol) -> None:
        self.session = session
        self.passes = 0

    @property
    def position(self) -> int:
        return self.session.position

    def prefill(self, ids: Sequence[int], logits: bool = True) -> np.ndarray | None:
        return self.session.prefill(ids, logits=logits)

    def step(self, token: int) -> np.ndarray:
        self.passes += 1
        return self.session.step(token)

    def settle(self) -> None:
        """Nothing to undo."""

    def stats(self) -> dict[str, int]:
        return {"decode_passes": self.passes, **{f"{s}_drafted": 0 for s in SOURCES},
                **{f"{s}_accepted": 0 for s in SOURCES}}


class Speculator(PlainStepper):
    """The session seen through drafts (module docstring). `state()` says where the turn is
    (grammar matcher, free phase) when a draft is proposed; `limit` is the context length
    (no draft reaches past it); `max_steps` the most steps the turn can still ask for;
    `opening` the tokens drafted with the prompt (see `prefill`); `policy` how much of a
    draft is worth verifying (`draft_policy.py`: the caller passes the one learnt for
    its model, `policy_for`; by default a fresh one)."""

    def __init__(self, session: SessionProtocol, drafter: Drafter,
                 state: Callable[[], DraftState], *, limit: int | None = None,
                 max_steps: int | None = None,
                 opening: Sequence[int] = (), policy: DraftPolicy | None = None) -> None:
        super().__init__(session)
        self.drafter = drafter
        self.state = state
        self.limit = limit
        self.opening = [int(t) for t in opening]
        self.steps_left = max_steps if max_steps is not None else 1 << 62
        self.policy = policy if policy is not None else DraftPolicy()
        # fed to the session ahead of the turn, not yet asked for: (token, row, source, kind)
        self.ahead: deque[tuple[int, np.ndarray, str, str]] = deque()
        self.drafted = dict.fromkeys(SOURCES, 0)
        self.accepted = dict.fromkeys(SOURCES, 0)

    @property
    def position(self) -> int:
        """The position the turn is at (draft tokens fed ahead of it do not count)."""
        return self.session.position - len(self.ahead)

    def prefill(self, ids: Sequence[int], logits: bool = True) -> np.ndarray | None:
        """Consume the prompt, with the `opening` drafted after it when that pays: its rows
        come from one `extend` of the prompt's last tokens and the opening (chunking never
        changes a deploy row's bits). When the prompt's last chunk is short, that extend is
        the last chunk itself (no extra pass); otherwise all but the last prompt token are
        prefilled first, and the opening is drafted only when its expected saving beats
        the extra pass (`DraftPolicy.worth_pass`)."""
        self.settle()
        ids = [int(t) for t in ids]
        self.drafter.index.extend(ids)
        opening = self.opening[: self._room(len(ids) - 1)] if logits and ids else []
        opening = opening[: self.policy.keep([OPENING] * len(opening))]
        if not opening:
            return self.session.prefill(ids, logits=logits)
        cut = len(ids) - 1  # the prompt before the pass that drafts the opening
        chunk = self.session.capabilities.chunk
        if chunk is not None and chunk > 0:
            aligned = cut // chunk * chunk  # where the prompt's last chunk starts
            if len(ids) - aligned <= SHORT_TAIL and len(ids) - aligned + len(opening) <= chunk:
                cut = aligned
        if cut == len(ids) - 1 and cut and not self.policy.worth_pass([OPENING] * len(opening)):
            return self.session.prefill(ids, logits=logits)
        if cut:
            self.session.prefill(ids[:cut], logits=False)
        before = self.session.position
        try:
            rows = self.session.extend(ids[cut:] + opening)
        except NonFiniteActivationError:  # as in `_pass`: the prompt's tail on its own
            if self.session.position > before:
                self.session.rewind(self.session.position - before)
            return self.session.prefill(ids[cut:], logits=logits)
        last = len(ids) - cut - 1
        for token, row in zip(opening, rows[last + 1 :], strict=True):
            self.ahead.append((token, row, OPENING, OPENING))
        self.drafted[OPENING] += len(opening)
        return rows[last]

    def step(self, token: int) -> np.ndarray:
        token = int(token)
        self.steps_left -= 1
        self.drafter.index.extend([token])
        if self.ahead:
            drafted, row, source, kind = self.ahead[0]
            self.policy.reached(kind, drafted == token)
            if drafted == token:
                self.ahead.popleft()
                self.accepted[source] += 1
                return row
            self.settle()
        return self._pass(token)

    def _room(self, before: int = 0) -> int:
        """Draft tokens that can follow `before` more tokens and the one being stepped."""
        room = min(MAX_DRAFT, max(0, self.steps_left))
        if self.limit is not None:  # the token and its draft must fit the context
            room = min(room, self.limit - self.session.position - before - 1)
        return max(0, room)

    def _pass(self, token: int) -> np.ndarray:
        room = self._room()
        draft = self.drafter.propose(self.state(), LOOKUP_MAX, room) if room else Draft()
        draft = draft.cut(self.policy.keep(draft.kinds))
        self.passes += 1
        start = time.perf_counter()
        if not draft.tokens:
            row = self.session.step(token)
            self.policy.timed(1, time.perf_counter() - start)
            return row
        before = self.session.position
        try:
            rows = self.session.extend([token, *draft.tokens])
        except NonFiniteActivationError:
            # Non-finite activations somewhere in the draft: decode this token on its own,
            # which raises exactly when plain decoding would.
            if self.session.position > before:
                self.session.rewind(self.session.position - before)
            return self.session.step(token)
        self.policy.timed(1 + len(draft), time.perf_counter() - start)
        for entry in zip(draft.tokens, rows[1:], draft.sources, draft.kinds, strict=True):
            self.ahead.append(entry)
            self.drafted[entry[2]] += 1
        return rows[0]

    def settle(self) -> None:
        """Undo the draft tokens fed ahead of the turn (the session then holds exactly the
        tokens the turn stepped)."""
        if self.ahead:
            self.session.rewind(len(self.ahead))
            self.ahead.clear()

    def stats(self) -> dict[str, int]:
        return {"decode_passes": self.passes,
                **{f"{s}_drafted": self.drafted[s] for s in SOURCES},
                **{f"{s}_accepted": self.accepted[s] for s in SOURCES}}


def stepper(session: SessionProtocol, speculate: bool, drafter: Callable[[], Drafter],
            state: Callable[[], DraftState], **options: Any) -> PlainStepper:
    """A `Speculator` (with `options`) when asked for and the session supports it, else a
    `PlainStepper`."""
    if speculate and speculation_supported(session):
        return Speculator(session, drafter(), state, **options)
    return PlainStepper(session)


__all__ = ["LOOKUP_MAX", "PlainStepper", "Speculator", "speculation_supported", "stepper"]
