"""The packages of the `hf` extra, imported only when a Hugging Face / GGUF file needs them.

One place says how a missing one fails: the typed error of the caller's format (never a bare
ImportError), naming the package and the extra to install (issue 27: one of each thing).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import NeedlepointError


def hf_extra(name: str, needs: str, error: type[NeedlepointError],
             *submodules: str) -> ModuleType:
    """The module `name` (and its `submodules` loaded too), else `error` with the message
    "`needs`: pip install 'needlepoint[hf]'"."""
    try:
        module = importlib.import_module(name)
        for sub in submodules:
            importlib.import_module(f"{name}.{sub}")
    except ImportError as missing:  # pragma: no cover - the `hf` extra is not installed
        raise error(f"{needs}: pip install 'needlepoint[hf]'") from missing
    return module
