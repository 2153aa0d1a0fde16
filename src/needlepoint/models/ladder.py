"""The depth ladder shared by both generations (needle3 fixture README "Ladder").

Upstream's rung of depth k keeps `ladder_layer_indices(L, k)`: start with {0, L-1}, then
repeatedly add the midpoint `(left + right) // 2` of the widest gap (leftmost on ties). Each
generation renumbers the kept blocks in its own `ladder_config`.
"""

from __future__ import annotations

from ..errors import ModelInputError


def ladder_layer_indices(num_layers: int, depth: int) -> tuple[int, ...]:
    """Block indices (of the full model, ascending) kept by the `depth`-layer rung.

    Valid depths are 2..L (and 1 for a one-layer model); anything else is a
    `ModelInputError` (a `ValueError`).
    """
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise ModelInputError(f"layers must be an int, got {depth!r}")
    lowest = 1 if num_layers == 1 else 2  # every rung keeps both endpoint blocks
    if not lowest <= depth <= num_layers:
        raise ModelInputError(
            f"layers={depth} is not a rung of this {num_layers}-layer model "
            f"(valid: {lowest}..{num_layers})"
        )
    kept = sorted({0, num_layers - 1})
    while len(kept) < depth:
        gaps = [(kept[i + 1] - kept[i], i) for i in range(len(kept) - 1)]
        _, at = max(gaps, key=lambda gap: (gap[0], -gap[1]))
        kept.insert(at + 1, (kept[at] + kept[at + 1]) // 2)
    return tuple(kept)
