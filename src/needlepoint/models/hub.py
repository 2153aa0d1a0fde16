"""Where models come from: an explicit path, `NEEDLEPOINT_MODEL`, the bundled demo model, or
the Hugging Face Hub (`needlepoint download`, optional `huggingface_hub` dependency).

Loaded models are read-only after loading (sessions hold all mutable state), so several
`Needle` instances may share one: `ModelCache` is the explicit, lock-protected place where
that sharing happens, keyed by the file's resolved path, size and modification time.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import NeedlepointError
from .protocol import ModelNotFoundError, resolve_model_name

__all__ = ["ModelNotFoundError", "resolve_model_name"]

MODEL_ENV = "NEEDLEPOINT_MODEL"
BUNDLED_MODEL = "needle3-toy.cact"
DEFAULT_REPO = "Cactus-Compute/needle3"
DOWNLOAD_PATTERNS = ["*.cact", "*.json", "*.md"]


class DownloadError(NeedlepointError, RuntimeError):
    """The Hub download could not run (no network, no `huggingface_hub`, unknown repo)."""


def bundled_model_path() -> Path:
    """The demo model shipped as package data (`needlepoint/data/needle3-toy.cact`)."""
    path = Path(str(resources.files("needlepoint") / "data" / BUNDLED_MODEL))
    if not path.is_file():
        raise ModelNotFoundError(f"the bundled demo model is missing ({path}): reinstall "
                                 f"needlepoint or pass model=/path/to/model.cact")
    return path


def resolve_model_path(model: str | os.PathLike[str] | None = None) -> Path:
    """`model` if given, else `$NEEDLEPOINT_MODEL`, else the bundled demo model; a name is
    resolved by `protocol.resolve_model_name` (a .cact / .gguf path, a Hugging Face model
    directory, or a known name such as "smollm2")."""
    if model is None:
        model = os.environ.get(MODEL_ENV) or None
        if model is None:
            return bundled_model_path()
        source = f"${MODEL_ENV}"
    else:
        source = "model"
    return resolve_model_name(model, source)


class ModelCache:
    """Loaded models keyed by (resolved path, size, mtime); safe to use from many threads."""

    def __init__(self, loader: Callable[[Path], Any] | None = None) -> None:
        self._loader = loader
        self._models: dict[tuple[str, int, int], Any] = {}
        self._lock = threading.Lock()

    def load(self, path: str | os.PathLike[str], threads: int | None = None) -> Any:
        resolved = Path(path).resolve()
        stat = (resolved / "config.json").stat() if resolved.is_dir() else resolved.stat()
        key = (str(resolved), stat.st_size, stat.st_mtime_ns, threads)
        with self._lock:  # held while loading, so two threads never load the same file twice
            model = self._models.get(key)
            if model is None:
                model = self._models[key] = self._load(resolved, threads)
            return model

    def _load(self, path: Path, threads: int | None = None) -> Any:
        if self._loader is not None:
            return self._loader(path)
        from .loader import load

        return load(path, threads=threads)

    def clear(self) -> None:
        with self._lock:
            self._models.clear()


# The one shared cache `Needle` uses unless given another (or `cache=None`).
MODEL_CACHE = ModelCache()


def is_model(obj: Any) -> bool:
    """An already-loaded model (anything that can open a session and has a tokenizer)."""
    return callable(getattr(obj, "session", None)) and hasattr(obj, "tokenizer")


def load_model(
    model: Any = None, cache: ModelCache | None = MODEL_CACHE, threads: int | None = None
) -> Any:
    """A loaded model from a model object, a path, `$NEEDLEPOINT_MODEL` or the bundled one;
    `threads` as `needlepoint.load` (None: its default)."""
    if is_model(model):
        return model
    path = resolve_model_path(model)
    if cache is None:
        from .loader import load

        return load(path, threads=threads)
    return cache.load(path, threads)


def download(
    repo_id: str = DEFAULT_REPO,
    *,
    local_dir: str | os.PathLike[str] | None = None,
    timeout_s: float = 10.0,
) -> Path:
    """Fetch a model repository from the Hugging Face Hub; return the `.cact` file's path.

    Fails fast with `DownloadError` when `huggingface_hub` is missing, the Hub is offline
    (`HF_HUB_OFFLINE=1`) or unreachable, or the repository holds no `.cact` file."""
    # huggingface_hub reads its timeouts when imported: set them first.
    seconds = str(max(1, math.ceil(timeout_s)))  # it parses them as integers
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", seconds)
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", seconds)
    try:
        import huggingface_hub
    except ImportError:
        raise DownloadError("downloading needs huggingface_hub: "
                            "pip install 'needlepoint[download]'") from None
    try:
        folder = huggingface_hub.snapshot_download(
            repo_id, allow_patterns=DOWNLOAD_PATTERNS,
            local_dir=None if local_dir is None else str(local_dir),
        )
    except Exception as error:  # network stacks raise many types; all mean "not downloaded"
        raise DownloadError(f"could not download {repo_id} from the Hugging Face Hub "
                            f"({type(error).__name__}: {error}); check the network, or pass a "
                            f"local .cact file with --model") from None
    found = sorted(Path(folder).rglob("*.cact"))
    if not found:
        raise DownloadError(f"{repo_id} has no .cact file (downloaded to {folder})")
    return found[0]
