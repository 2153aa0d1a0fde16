"""Deploy weights: every CQ x A8 product as packed CQ rows straight from the archive's memory
map (`kernels.exact.ExactMatrix`), no float32 copy (docs/numerics.md "CQ x A8 products").

The fused products are the float path's arena slots (`weights.plan`): q/k/v/gate per layer,
phi_pre/phi_post/phi_res per layer, engram key/value per site, and the LM head (the first
`logits_vocab` embedding rows, tied). Each slot becomes a list of `ExactMatrix` (one per run of
parts sharing storage width and codebook), multiplied by `exact.a8_product`.
"""

from __future__ import annotations

from ...errors import NeedlepointError
from ...formats.cact import CactArchive
from ...kernels.exact import ExactEngineError, ExactMatrix, exact_matrices
from .weights import Slot


class DeployUnsupportedError(NeedlepointError, ValueError):
    """An archive tensor the exact deploy engine cannot multiply (not CQ, or a group other than
    128); `needlepoint.load(path, numerics="float")` runs it."""


def exact_slot(archive: CactArchive, slot: Slot, threads: int = 1) -> list[ExactMatrix]:
    pieces = []
    for name, first, end in slot.parts:
        wtype = archive.wtype(name)
        if wtype.kind != "cq" or wtype.product is None:
            raise DeployUnsupportedError(
                f"{name} is stored as {wtype.name}; deploy numerics need CQ matrices "
                "(load with numerics='float')"
            )
        pieces.append((archive.cq(name), first, end))
    try:
        return exact_matrices(pieces, threads)
    except ExactEngineError as error:
        raise DeployUnsupportedError(f"{slot.key}: {error} (load with numerics='float')") from None


def exact_slots(
    archive: CactArchive, slots: list[Slot], threads: int = 1
) -> dict[str, list[ExactMatrix]]:
    """The deploy products of `slots` by key (same keys as the float arena); `threads` for
    the native kernel's large products."""
    return {slot.key: exact_slot(archive, slot, threads) for slot in slots}
