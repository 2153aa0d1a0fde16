"""A scripted stand-in for a model session, for testing the generator without real weights.

`ScriptedModel(tokenizer, script)` gives logits that put `strength` on `script[k]` at the
k-th token of each assistant turn (counted from the end of that turn's prefill), over
deterministic noise keyed by the absolute position. It records every prefill and step so
tests can check how the generator drives a session.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


class ScriptedSession:
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.ids: list[int] = []
        self.prefills: list[tuple[list[int], bool]] = []
        self.steps: list[int] = []
        self.turn_start = 0

    @property
    def position(self) -> int:
        return len(self.ids)

    def _logits(self) -> np.ndarray:
        model = self.model
        noise = np.random.default_rng([len(self.ids), self.ids[-1] if self.ids else 0])
        logits = noise.normal(0.0, model.noise, model.vocab).astype(np.float32)
        k = len(self.ids) - self.turn_start
        script = model.scripts[min(len(self.prefills), len(model.scripts)) - 1]
        if k < len(script):
            logits[script[k]] += model.strength
        return logits

    def prefill(self, ids, logits: bool = True):
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("empty prefill")
        self.prefills.append((ids, logits))
        self.ids.extend(ids)
        self.turn_start = len(self.ids)
        if len(self.ids) > self.model.config.max_seq_len:
            raise ValueError("context exhausted")
        return self._logits() if logits else None

    def step(self, token_id: int) -> np.ndarray:
        self.steps.append(int(token_id))
        self.ids.append(int(token_id))
        if len(self.ids) > self.model.config.max_seq_len:
            raise ValueError("context exhausted")
        return self._logits()


class ScriptedModel:
    """`scripts[i]` drives turn i (the last script repeats for later turns)."""

    def __init__(self, tokenizer, *scripts: list[int], strength: float = 12.0,
                 noise: float = 1.0, max_seq_len: int = 4096, head_logit: float | None = None):
        self.tokenizer = tokenizer
        self.scripts = [list(s) for s in scripts] or [[]]
        self.strength = strength
        self.noise = noise
        self.vocab = tokenizer.vocab_size
        self.config = SimpleNamespace(max_seq_len=max_seq_len, logits_vocab=self.vocab)
        self.head_logit = head_logit
        self.sessions: list[ScriptedSession] = []
        self.confidence_calls: list[list[int]] = []

    def session(self, kv_window: int | None = None) -> ScriptedSession:
        session = ScriptedSession(self)
        self.sessions.append(session)
        return session

    def confidence_logit(self, ids) -> float | None:
        self.confidence_calls.append(list(ids))
        return self.head_logit


def answer_ids(tokenizer, answer: str) -> list[int]:
    """Ids of an assistant answer as training encodes it (separately, dummy prefix on)."""
    return tokenizer.encode(answer)
