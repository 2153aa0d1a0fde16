"""The decisions a model made in one answer, as evidence for its confidence (`api/confidence.py`).

A turn is decoded under a grammar that leaves the model a choice at some tokens and forces the
others. Only the choices are evidence of what the model believed; a forced token (one the
grammar allowed alone) says nothing. Each chosen token gets

    q = p(token) / sum of p(a) over the tokens a the grammar allowed there

where p is the model's own distribution (softmax of the raw logits at temperature 1): the
probability the model gave its choice among the alternatives it actually had. A *decision* is
a maximal run of consecutive chosen tokens of one kind (below), ended by a forced token; its
probability is the lowest q of its tokens (its weakest branch point: "Paris" against "Parma"
is decided at the second token, a long confident value does not lower it). The kinds:

* "route": the answer's first open choice between calling and answering in text (`tool_choice`
  auto): its probability is the mass the model gave the side it took (every token that begins
  the call marker against every text token the grammar allowed), not the one token's;
* "call": a token written inside call k's JSON object (its name, its argument keys and values
  where the grammar left a choice); `call` is k, counted in the order the calls are written;
* "between": inside the calls but outside every call object: another call or the end of the
  list (the number of calls).

Text after a "route" to text carries no evidence (nothing checks prose), nor does reasoning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from .json_text import string_step

ROUTE, CALL, BETWEEN = "route", "call", "between"


@dataclass
class Decision:
    """One decision: its kind, the call it belongs to ("call" only), its probability (the
    lowest q of its tokens) and how many chosen tokens it spans."""

    kind: str
    call: int | None
    prob: float
    tokens: int = 1

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "call": self.call, "prob": self.prob, "tokens": self.tokens}


def choice_probability(logits: np.ndarray, allowed: np.ndarray | None, token: int
                       ) -> tuple[float, int]:
    """(q, alternatives): the chosen token's probability among the allowed tokens (float64
    softmax of the raw logits) and how many tokens were allowed (1: forced)."""
    x = np.asarray(logits, np.float64).reshape(-1)
    e = np.exp(x - x.max())
    if allowed is None:
        return float(e[token] / e.sum()), int(x.shape[0])
    mask = np.asarray(allowed, bool)[: x.shape[0]]
    total = float(e[mask].sum())
    count = int(np.count_nonzero(mask))
    if total <= 0.0:  # every allowed token underflowed: no information
        return 1.0 / max(count, 1), count
    return float(e[token] / total), count


def route_probability(logits: np.ndarray, allowed: np.ndarray, call_side: np.ndarray,
                      token: int) -> float | None:
    """The mass the model gave the side (call or text) that `token` is on, among the allowed
    tokens; None when only one side was allowed (no route decision)."""
    mask = np.asarray(allowed, bool)
    side = np.asarray(call_side, bool)[: mask.shape[0]]
    calls, texts = mask & side, mask & ~side
    if not calls.any() or not texts.any():
        return None
    x = np.asarray(logits, np.float64).reshape(-1)[: mask.shape[0]]
    e = np.exp(x - x.max())
    total = float(e[mask].sum())
    if total <= 0.0:
        return None
    p_call = float(e[calls].sum()) / total
    return p_call if side[token] else 1.0 - p_call


def _canonical(text: str) -> str:
    """A call object's text as a comparable key (the same call spaced differently is equal)."""
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except json.JSONDecodeError:
        return text


@dataclass
class CallCursor:
    """Where the call JSON written so far stands: inside the k-th top-level object of the call
    list, or between objects, and whether a finished call repeats an earlier one (the turn
    then ends with the calls made: a model looping on one call). Fed the call text as it is
    written (`ToolCallDelta`s)."""

    depth: int = 0
    objects: int = 0
    in_string: bool = False
    escaped: bool = False
    current: list[str] = field(default_factory=list)  # the call object being written
    written: list[str] = field(default_factory=list)  # each finished call object's text
    repeated: bool = False  # the last finished call repeats an earlier one exactly

    def feed(self, text: str) -> None:
        for ch in text:
            if self.depth >= 2 or (ch == "{" and self.depth == 1 and not self.in_string):
                self.current.append(ch)
            if self.in_string:
                self.in_string, self.escaped = string_step(ch, self.escaped)
            elif ch == '"':
                self.in_string = True
            elif ch in "[{":
                self.depth += 1
                if ch == "{" and self.depth == 2:
                    self.objects += 1
            elif ch in "]}":
                self.depth -= 1
                if self.depth == 1 and ch == "}":
                    self._finished("".join(self.current))
                    self.current = []

    def _finished(self, text: str) -> None:
        key = _canonical(text)
        self.repeated = self.repeated or key in self.written
        self.written.append(key)

    @property
    def call(self) -> int | None:
        """The index of the call object being written, or None between objects."""
        return self.objects - 1 if self.depth >= 2 else None


@dataclass
class DecisionLog:
    """The decisions of one turn as it is decoded (`turn.TurnState.pick` feeds it)."""

    decisions: list[Decision] = field(default_factory=list)
    routed: bool = False
    _open: Decision | None = None

    def route(self, prob: float) -> None:
        self.decisions.append(Decision(ROUTE, None, prob))
        self.routed = True
        self._open = None

    def forced(self) -> None:
        """A token the grammar forced: it ends the decision being made."""
        self._open = None

    def choose(self, kind: str, call: int | None, q: float) -> None:
        """A chosen token of `kind` (and call) with probability q among its alternatives."""
        run = self._open
        if run is not None and run.kind == kind and run.call == call:
            run.prob = min(run.prob, q)
            run.tokens += 1
            return
        self._open = Decision(kind, call, q)
        self.decisions.append(self._open)


__all__ = ["BETWEEN", "CALL", "ROUTE", "CallCursor", "Decision", "DecisionLog",
           "choice_probability", "route_probability"]
