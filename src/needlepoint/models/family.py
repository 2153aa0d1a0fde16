"""The one dispatch from a file to a model family (`loader.load` and
`parts.load_part` both went their own way before).

A known name (`smollm2`) is resolved to its file first; a Hugging Face model directory or a
GGUF file is the transformer family; a `.cact` archive is Needle 3 or Needle 2 by its tag (the
archive opened here is handed on, so it is read once).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..formats.cact import open_archive
from ..formats.checkpoints import is_checkpoint

FAMILIES = ("transformer", "needle3", "needle2")


@dataclass(frozen=True)
class ModelSource:
    """A model file and the family that reads it (`archive`: the opened `.cact`, or None)."""

    path: str | os.PathLike[str]
    family: str
    archive: Any = None


def identify(path: str | os.PathLike[str]) -> ModelSource:
    """The family of the model at `path` (a known name, an HF directory, a GGUF or a `.cact`
    file); the archive's own errors for anything else."""
    from .known import known_file

    path = known_file(path)  # a model shipped in a package, e.g. "smollm2"
    if is_checkpoint(path):
        return ModelSource(path, "transformer")
    archive = open_archive(path)
    return ModelSource(path, "needle3" if archive.generation == 3 else "needle2", archive)


__all__ = ["FAMILIES", "ModelSource", "identify"]
