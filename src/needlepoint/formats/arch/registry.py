"""The architectures the transformer runs, collected from their files (`formats/arch/<name>.py`,
each exporting `ARCH`), looked up by `config.json` `model_type` or GGUF
`general.architecture`. `register` adds one at run time (a test's own architecture); the
built-in ones are listed here once."""

from __future__ import annotations

from ...errors import UnsupportedArchitectureError
from . import gemma2, gemma3, gpt2, llama, qwen2, qwen3
from .base import Architecture

_BUILT_IN = (llama.ARCH, gpt2.ARCH, qwen2.ARCH, qwen3.ARCH, gemma2.ARCH, gemma3.ARCH)
_ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    """Add `arch` (its name, model types and GGUF name must be new); returns it."""
    taken = {a.name for a in _ARCHITECTURES.values()}
    types = {t for a in _ARCHITECTURES.values() for t in a.model_types}
    ggufs = {a.gguf.name for a in _ARCHITECTURES.values() if a.gguf is not None}
    if (arch.name in taken or types & set(arch.model_types)
            or (arch.gguf is not None and arch.gguf.name in ggufs)):
        raise ValueError(f"architecture {arch.name!r} clashes with a registered one")
    _ARCHITECTURES[arch.name] = arch
    return arch


def unregister(name: str) -> None:
    """Remove a registered architecture (a test's, when it is done)."""
    _ARCHITECTURES.pop(name, None)


for _arch in _BUILT_IN:
    register(_arch)


def architectures() -> tuple[Architecture, ...]:
    return tuple(_ARCHITECTURES.values())


def by_name(name: str) -> Architecture:
    """The architecture a spec names (`BlockSpec.architecture`)."""
    return _ARCHITECTURES[name]


def by_model_type(kind: object) -> Architecture:
    """The architecture that reads `config.json` `model_type` `kind`, else a typed refusal."""
    for arch in _ARCHITECTURES.values():
        if kind in arch.model_types:
            return arch
    supported = ", ".join(t for a in _ARCHITECTURES.values() for t in a.model_types)
    raise UnsupportedArchitectureError(
        f"config.json: model_type {kind!r} is not supported (supported: {supported})")


def by_gguf(name: object, where: str) -> Architecture:
    """The architecture llama.cpp names `name` in `general.architecture` (file `where`)."""
    for arch in _ARCHITECTURES.values():
        if arch.gguf is not None and arch.gguf.name == name:
            return arch
    supported = ", ".join(a.gguf.name for a in _ARCHITECTURES.values() if a.gguf is not None)
    raise UnsupportedArchitectureError(
        f"{where}: GGUF architecture {name!r} is not supported (supported: {supported})")
