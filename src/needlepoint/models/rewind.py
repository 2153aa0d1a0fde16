"""The one check of a session's `rewind(n)` argument, shared by every family's session and the
staged session (one of each thing)."""

from __future__ import annotations

import numpy as np

from ..errors import ModelInputError


def rewind_count(n: object, position: int) -> int:
    """`n` as an int after checking it is a count >= 0 of positions that were consumed
    (`position` of them); a clear `ModelInputError` otherwise."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ModelInputError(f"rewind needs a count >= 0, got {n!r}")
    if n > position:
        raise ModelInputError(f"cannot rewind {n} positions: only {position} consumed")
    return int(n)
