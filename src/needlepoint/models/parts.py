"""The part of a model a head or a stage holds, for every family that can be cut into
stages (`layer_range.LayerRange`): Needle 3 `.cact` archives, Hugging Face model
directories and GGUF files (Llama family, GPT-2). `load_part` opens the file itself and
prepares only that part's weights.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import StagePlanError
from .family import identify
from .layer_range import LayerRange
from .numerics import FAMILY_NUMERICS


def family_of(path: str | os.PathLike[str]) -> str:
    """"needle3" or "transformer" (`family.identify`); StagePlanError for a model no stage
    can hold."""
    family = identify(path).family
    if family not in ("needle3", "transformer"):
        raise StagePlanError(f"{path}: Needle 2 archives are not supported with stages "
                             "(Needle 3, Hugging Face and GGUF models are)")
    return family


def load_part(path: str | os.PathLike[str], *, blocks: tuple[int, int] | None = None,
              head: bool = False, layers: int | None = None, numerics: str = "deploy",
              threads: int = 1, cache: bool | None = None) -> LayerRange:
    """The head's part (`head=True`: embedding, final norm, LM head, ...) or blocks
    `first .. end-1` (`blocks=(first, end)`) of the model at `path` (`layers`: a Needle 3
    ladder rung / a transformer's first `layers` blocks)."""
    if head == (blocks is not None):
        raise ValueError("load_part: give either head=True or blocks=(first, end)")
    if family_of(path) == "transformer":
        from .transformer.layer_range import TransformerPart

        return TransformerPart.load(path, blocks=blocks, head=head, layers=layers,
                                    numerics=numerics, threads=threads, cache=cache)
    from .needle3.layer_range import V3Part

    return V3Part.load(path, blocks=blocks, head=head, layers=layers, numerics=numerics,
                       threads=threads, cache=cache)


def part_numerics(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The numerics a model's parts accept."""
    return FAMILY_NUMERICS[identify(path).family]


__all__: list[Any] = ["family_of", "load_part", "part_numerics"]
