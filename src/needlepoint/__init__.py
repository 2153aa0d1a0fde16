"""needlepoint: a fast, exact Python inference engine for Cactus Needle tool-calling models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import kernels
from .errors import (
    CactFormatError,
    ModelInputError,
    NeedlepointError,
    TokenizerError,
    ToolSchemaError,
)
from .formats.cact import CactArchive, open_archive
from .models.loader import NUMERICS, load
from .version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from .api.needle import Needle, tool


def __getattr__(name: str) -> Any:
    # The API layer sits above the models; import it only when asked for.
    if name in ("Needle", "tool"):
        from .api import needle as api

        return getattr(api, name)
    raise AttributeError(f"module 'needlepoint' has no attribute {name!r}")


__all__ = [
    "NUMERICS",
    "CactArchive",
    "CactFormatError",
    "ModelInputError",
    "Needle",
    "NeedlepointError",
    "TokenizerError",
    "ToolSchemaError",
    "__version__",
    "load",
    "kernels",
    "open_archive",
    "tool",
]
