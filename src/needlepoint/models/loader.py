"""Open a model file: `family.identify` picks the family (a `.cact` archive's tag: Needle 3 or
2; a Hugging Face directory or GGUF file: the transformer family).

`needlepoint.load` is this function; `models.hub` resolves names and the bundled model to a path
and calls it, so model lookup sits above nothing it needs.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

from ..errors import InvalidOptionError
from .family import identify
from .numerics import ALL_NUMERICS, NEEDLE_NUMERICS, check_numerics

NUMERICS = NEEDLE_NUMERICS  # the public `needlepoint.NUMERICS` (Needle archives' names)
THREADS_ENV = "NEEDLEPOINT_THREADS"


class LoadOptions(TypedDict, total=False):
    """The options of `load` (documented there) that `needlepoint.load` passes on unchanged
    (one list of them, not a copy of the signature)."""

    layers: int | None
    numerics: str
    cache: bool | None
    threads: int | None


def resolve_threads(threads: int | None) -> int:
    """The thread count to use: `threads`, else $NEEDLEPOINT_THREADS, else 1 (decode is fastest
    on one thread and a second core is often busy; prefill gains from 2). Caps BLAS/OpenMP
    pools to it for the whole process (threadpoolctl): the float path's BLAS never spins more
    threads than asked for. The deploy path's native kernels start their threads per large
    product and join them before returning (no pool)."""
    if threads is None:
        raw = os.environ.get(THREADS_ENV, "1")
        try:
            threads = int(raw)
        except ValueError:
            raise InvalidOptionError(f"{THREADS_ENV} must be a positive integer, got {raw!r}"
                                     ) from None
        if threads < 1:
            raise InvalidOptionError(f"{THREADS_ENV} must be a positive integer, got {raw!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidOptionError(f"threads must be a positive integer, got {threads!r}")
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    return threads


def load(
    path: str | os.PathLike[str],
    *,
    layers: int | None = None,
    numerics: str = "deploy",
    cache: bool | None = None,
    threads: int | None = None,
) -> Any:
    """Load a `.cact` model; the generation (Needle 3 or 2) comes from the archive's tag.
    A Hugging Face model directory, a `.gguf` file or a known name ("smollm2") loads a
    Llama-family / GPT-2 model instead (`models/transformer/`, docs/hf.md).

    `layers=N` selects the N-layer rung of the depth ladder as upstream selects it;
    `numerics="deploy"` (A8 activations, int8 KV: what the archive is meant to run at) or
    `"float"` (the stored weights with no activation or KV quantisation). For a transformer
    model `numerics` is "float", "int8" (block-scaled int8 products, pinned elementwise parts,
    int8 KV: the same bits on every machine) or "deploy", which is "int8". `cache` (Needle 3,
    and a transformer's int8 weights converted from float): reuse/write the prepared weights in
    the on-disk cache (`needlepoint.weight_cache`, `models/transformer/int8_cache.py`; None =
    on unless the environment sets NEEDLEPOINT_CACHE=0). `threads`: CPU threads for the
    model's products (`resolve_threads`: default 1); it also caps the process's BLAS/OpenMP
    pools (threadpoolctl), so no pool is left spinning on a busy machine.

    A model cut into stages (`stages=`) is built one layer up, by `needlepoint.load` (the
    package facade) and `needlepoint.stages`.
    """
    if numerics not in ALL_NUMERICS:
        check_numerics(numerics, "needle3")  # the error names every accepted value
    threads = resolve_threads(threads)
    source = identify(path)
    check_numerics(numerics, source.family)
    if source.family == "transformer":
        from .transformer.model import load_transformer

        return load_transformer(source.path, layers=layers, numerics=numerics, threads=threads,
                                cache=cache)
    if source.family == "needle3":
        from .needle3.model import V3Model

        return V3Model.from_archive(source.archive, layers=layers, numerics=numerics,
                                    cache=cache, threads=threads)
    from .needle2.model import V2Model

    return V2Model.from_archive(source.archive, layers=layers, numerics=numerics)
