"""The packages of the `hf` extra, imported only when a Hugging Face / GGUF file needs them.

One place says how a missing one fails: the typed error of the caller's format (never a bare
ImportError), naming the package and the extra to install (one of each thing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import NeedlepointError


@contextmanager
def hf_extra(needs: str, error: type[NeedlepointError]) -> Iterator[None]:
    """Around the imports of an `hf` extra package: a missing one raises `error` with the
    message "`needs`: pip install 'needlepoint[hf]'"."""
    try:
        yield
    except ImportError as missing:  # pragma: no cover - the `hf` extra is not installed
        raise error(f"{needs}: pip install 'needlepoint[hf]'") from missing
