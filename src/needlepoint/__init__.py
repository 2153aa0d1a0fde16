"""needlepoint: a fast, exact Python inference engine for Cactus Needle tool-calling models."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Unpack

from . import kernels
from .errors import (
    CactFormatError,
    ModelInputError,
    NeedlepointError,
    TokenizerError,
    ToolSchemaError,
)
from .formats.cact import CactArchive, open_archive
from .models.loader import NUMERICS, LoadOptions
from .models.loader import load as load_model_file
from .version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from .api.handoff import Handoff
    from .api.mcp_tools import McpTools
    from .api.needle import Needle, tool
    from .formats.checkpoints import open_checkpoint
    from .formats.gguf_write import GgufVocab, write_gguf
    from .models.parts import load_part
    from .models.protocol import resolve_model_name


def load(
    path: str | os.PathLike[str],
    *,
    stages: int | Sequence[int] | None = None,
    transport: str = "local",
    ray_address: str | None = None,
    stage_cpus: float | None = None,
    replicas: int = 1,
    **options: Unpack[LoadOptions],
) -> Any:
    """Load a model: a Needle `.cact` archive (Needle 3 or 2, from its tag), a Hugging Face
    model directory, a `.gguf` file or a known name (`models.loader.load` documents
    `layers`, `numerics`, `cache`, `threads`: its `LoadOptions`, one list of them and their
    defaults for both entry points).

    `stages=N` (balanced by weight bytes) or `stages=[0, 7, 14]` (each stage's first layer)
    cuts a Needle 3 model at block boundaries into stages (docs/distributed.md): in this
    process (`transport="local"`) or on Ray actors (`transport="ray"`, the `ray` extra; the
    cluster at `ray_address`; each stage reserves `stage_cpus` CPUs, default its threads),
    `replicas=R` copies of each stage range (a lost replica's sessions move to another).
    It has a model's interface and, in deploy numerics, the same
    logits bit for bit; `needlepoint.stages.load_staged` has the placement and recovery
    options."""
    if stages is not None or transport != "local" or ray_address is not None or \
            stage_cpus is not None or replicas != 1:
        from .stages import load_staged

        return load_staged(path, stages, transport=transport, ray_address=ray_address,
                           stage_cpus=stage_cpus, replicas=replicas, **options)
    return load_model_file(path, **options)


def __getattr__(name: str) -> Any:
    # Public names imported on first use (docs/api.md "Public names for clients"): the API
    # layer sits above the models, and the rarer names need not load with the package.
    if name in ("Needle", "tool"):
        from .api import needle as api

        return getattr(api, name)
    if name == "open_checkpoint":
        from .formats.checkpoints import open_checkpoint

        return open_checkpoint
    if name == "load_part":
        from .models.parts import load_part

        return load_part
    if name == "native_variant":
        from .kernels.native import simd_variant

        return simd_variant
    if name == "resolve_model_name":
        from .models.protocol import resolve_model_name

        return resolve_model_name
    if name == "Handoff":  # unsure answers go to a bigger model
        from .api.handoff import Handoff

        return Handoff
    if name == "McpTools":  # MCP servers as tools
        from .api.mcp_tools import McpTools

        return McpTools
    if name in ("CALIBRATION", "Calibration", "fit_calibration"):  # the confidence's map
        from .api import confidence

        return getattr(confidence, name)
    if name in ("write_gguf", "GgufVocab"):  # test and benchmark GGUFs
        from .formats import gguf_write

        return getattr(gguf_write, name)
    raise AttributeError(f"module 'needlepoint' has no attribute {name!r}")


__all__ = [
    "CALIBRATION",
    "NUMERICS",
    "Calibration",
    "CactArchive",
    "CactFormatError",
    "GgufVocab",
    "Handoff",
    "McpTools",
    "ModelInputError",
    "Needle",
    "NeedlepointError",
    "TokenizerError",
    "ToolSchemaError",
    "__version__",
    "load",
    "load_part",
    "kernels",
    "native_variant",
    "open_archive",
    "open_checkpoint",
    "fit_calibration",
    "resolve_model_name",
    "tool",
    "write_gguf",
]
