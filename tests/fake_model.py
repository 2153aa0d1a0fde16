"""A scripted stand-in for a model, for testing the generator without real weights.

`ScriptedModel(tokenizer, script)` gives logits that put `strength` on `script[k]` at the
k-th token of each assistant turn (counted from the end of that turn's prefill), over
deterministic noise keyed by the absolute position. It records every prefill and step so
tests can check how the generator drives a session.

It is written only against `models/protocol.py` (`ModelProtocol`, `SessionProtocol`) and
declares no optional capability beyond the confidence head: no `extend`, `rewind`, `fork`
or `run_batch`, so everything above the models must work with the core. `LogitSession` is
the core session the scripted ones here and in the generation tests build on.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from needlepoint.errors import ModelInputError
from needlepoint.formats.chat_format import NeedleFormat, TemplateFormat
from needlepoint.models.protocol import ModelCapabilities, SessionCapabilities


class LogitSession:
    """A session of prefill and step only (no optional capability) whose logits are
    `_logits()` of the ids so far; `turn_start` is where the last prefill ended."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.turn_start = 0

    @property
    def position(self) -> int:
        return len(self.ids)

    @property
    def capabilities(self) -> SessionCapabilities:
        return SessionCapabilities()  # prefill and step only

    def _logits(self) -> np.ndarray:
        raise NotImplementedError

    def _check(self) -> None:
        """Raise once the ids are past what the session holds (nothing here)."""

    def prefill(self, ids, logits: bool = True):
        self.ids.extend(int(t) for t in ids)
        self.turn_start = len(self.ids)
        self._check()
        return self._logits() if logits else None

    def step(self, token_id: int) -> np.ndarray:
        self.ids.append(int(token_id))
        self._check()
        return self._logits()


class AnswerScript(LogitSession):
    """Logits for an answer: at step k of the turn, 0 on `answer[k]`, `alternatives[k]`
    (id -> logit) on others, `off` elsewhere, so each decision's probability is known in
    closed form."""

    def __init__(self, vocab: int, answer: list[int], alternatives: dict[int, dict[int, float]],
                 off: float = -60.0):
        super().__init__()
        self.vocab, self.answer, self.alternatives, self.off = vocab, answer, alternatives, off

    def _logits(self) -> np.ndarray:
        k = len(self.ids) - self.turn_start
        logits = np.full(self.vocab, self.off, np.float32)
        if k < len(self.answer):
            logits[self.answer[k]] = 0.0
            for token, value in self.alternatives.get(k, {}).items():
                logits[token] = value
        return logits


class ScriptedSession(LogitSession):
    def __init__(self, model: ScriptedModel) -> None:
        super().__init__()
        self.model = model
        self.prefills: list[tuple[list[int], bool]] = []
        self.steps: list[int] = []

    def _logits(self) -> np.ndarray:
        model = self.model
        noise = np.random.default_rng([len(self.ids), self.ids[-1] if self.ids else 0])
        logits = noise.normal(0.0, model.noise, model.vocab).astype(np.float32)
        k = len(self.ids) - self.turn_start
        script = model.scripts[min(len(self.prefills), len(model.scripts)) - 1]
        if k < len(script):
            logits[script[k]] += model.strength
        return logits

    def _check(self) -> None:
        if len(self.ids) > self.model.config.max_seq_len:
            raise ValueError("context exhausted")

    def prefill(self, ids, logits: bool = True):
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("empty prefill")
        self.prefills.append((ids, logits))
        return super().prefill(ids, logits)

    def step(self, token_id: int) -> np.ndarray:
        self.steps.append(int(token_id))
        return super().step(token_id)


class ScriptedModel:
    """`scripts[i]` drives turn i (the last script repeats for later turns)."""

    def __init__(self, tokenizer, *scripts: list[int], strength: float = 12.0,
                 noise: float = 1.0, max_seq_len: int = 4096, head_logit: float | None = None):
        self.tokenizer = tokenizer
        self.scripts = [list(s) for s in scripts] or [[]]
        self.strength = strength
        self.noise = noise
        self.vocab = tokenizer.vocab_size
        self.config = SimpleNamespace(max_seq_len=max_seq_len, logits_vocab=self.vocab,
                                      vocab=self.vocab)
        self.head_logit = head_logit
        self.sessions: list[ScriptedSession] = []
        self.confidence_calls: list[list[int]] = []

    @property
    def capabilities(self) -> ModelCapabilities:
        return ModelCapabilities(confidence_head=True, name="scripted")

    @property
    def chat_format(self) -> NeedleFormat:
        return NeedleFormat(self.tokenizer)

    def check_ids(self, ids, position: int = 0) -> np.ndarray:
        tokens = np.asarray(ids, dtype=np.int64).reshape(-1)
        if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= self.vocab:
            raise ModelInputError(f"token ids must be in [0, {self.vocab}), got {ids!r}")
        return tokens

    def forward(self, ids) -> np.ndarray:
        session = ScriptedSession(self)
        tokens = [int(t) for t in self.check_ids(ids)]
        return np.stack([session.prefill(tokens[:1])] + [session.step(t) for t in tokens[1:]])

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


class ScriptedTemplateModel(ScriptedModel):
    """`ScriptedModel` with a chat template's format (a template model to the API)."""

    @property
    def chat_format(self) -> TemplateFormat:
        return TemplateFormat(self.tokenizer)
