"""needlepoint: a fast, exact Python inference engine for Cactus Needle tool-calling models."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .errors import (
    CactFormatError,
    ModelInputError,
    NeedlepointError,
    TokenizerError,
    ToolSchemaError,
)
from .formats.cact import CactArchive, open_archive

if TYPE_CHECKING:  # pragma: no cover
    from .api.needle import Needle, tool

__version__ = "0.1.0"

NUMERICS = ("deploy", "float")


def load(
    path: str | os.PathLike[str],
    *,
    layers: int | None = None,
    numerics: str = "deploy",
    cache: bool | None = None,
) -> Any:
    """Load a `.cact` model; the generation (Needle 3 or 2) comes from the archive's tag.

    `layers=N` selects the N-layer rung of the depth ladder as upstream selects it;
    `numerics="deploy"` (A8 activations, int8 KV: what the archive is meant to run at) or
    `"float"` (the stored weights with no activation or KV quantisation). `cache` (Needle 3):
    reuse/write the prepared weights in the on-disk cache (`needlepoint.weight_cache`; None =
    on unless the environment sets NEEDLEPOINT_CACHE=0).
    """
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    archive = open_archive(path)
    if archive.generation == 3:
        from .models.needle3.model import V3Model

        return V3Model.from_archive(archive, layers=layers, numerics=numerics, cache=cache)
    from .models.needle2.model import V2Model

    return V2Model.from_archive(archive, layers=layers, numerics=numerics)


def __getattr__(name: str) -> Any:
    # The API layer sits above the models; import it only when asked for.
    if name in ("Needle", "tool"):
        from .api import needle as api

        return getattr(api, name)
    raise AttributeError(f"module 'needlepoint' has no attribute {name!r}")


__all__ = [
    "CactArchive",
    "CactFormatError",
    "ModelInputError",
    "Needle",
    "NeedlepointError",
    "TokenizerError",
    "ToolSchemaError",
    "load",
    "open_archive",
    "tool",
]
