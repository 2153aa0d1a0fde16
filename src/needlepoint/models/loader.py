"""Open a `.cact` file as a model: the archive's tag picks the generation (Needle 3 or 2).

`needlepoint.load` is this function; `models.hub` resolves names and the bundled model to a path
and calls it, so model lookup sits above nothing it needs.
"""

from __future__ import annotations

import os
from typing import Any

from ..formats.cact import open_archive
from ..formats.checkpoints import is_checkpoint

NUMERICS = ("deploy", "float")


def load(
    path: str | os.PathLike[str],
    *,
    layers: int | None = None,
    numerics: str = "deploy",
    cache: bool | None = None,
) -> Any:
    """Load a `.cact` model; the generation (Needle 3 or 2) comes from the archive's tag.
    A Hugging Face model directory, a `.gguf` file or a known name ("smollm2") loads a
    Llama-family / GPT-2 model instead (`models/transformer/`, docs/hf.md).

    `layers=N` selects the N-layer rung of the depth ladder as upstream selects it;
    `numerics="deploy"` (A8 activations, int8 KV: what the archive is meant to run at) or
    `"float"` (the stored weights with no activation or KV quantisation). `cache` (Needle 3):
    reuse/write the prepared weights in the on-disk cache (`needlepoint.weight_cache`; None =
    on unless the environment sets NEEDLEPOINT_CACHE=0).
    """
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    from .transformer.known import is_known_name, resolve_known

    if is_known_name(path):  # a model shipped in a package, e.g. "smollm2"
        path = resolve_known(str(path))
    if is_checkpoint(path):  # a Hugging Face model directory or a GGUF file
        from .transformer.model import load_transformer

        return load_transformer(path, layers=layers, numerics=numerics)
    archive = open_archive(path)
    if archive.generation == 3:
        from .needle3.model import V3Model

        return V3Model.from_archive(archive, layers=layers, numerics=numerics, cache=cache)
    from .needle2.model import V2Model

    return V2Model.from_archive(archive, layers=layers, numerics=numerics)
