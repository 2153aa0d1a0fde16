"""The head's part of a chunk: `embed_chunk` embeds it (the layer-range interface's `embed`)
and refuses to send non-finite rows to stage 0 (docs/distributed.md, failure handling), for
a session's calls and for the pipeline's micro-batches alike (one head-embed
and finiteness check)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import NonFiniteActivationError, StageNonFiniteError
from ..models.layer_range import Embedded
from .stage import finite


def embed_chunk(part: Any, head: Any, chunk: np.ndarray, start: int) -> Embedded:
    """`part.embed(head, chunk, start)` (advancing the head state), or a StageNonFiniteError
    naming the chunk when the embedding, an engram lookup or what they computed is not
    finite."""
    try:
        embedded = part.embed(head, chunk, start)
    except NonFiniteActivationError as error:
        raise StageNonFiniteError(f"the head (embedding / engram lookups, chunk at "
                                  f"position {start}): {error}") from None
    if not finite(embedded.x) or not all(
            finite(a) for arrays in embedded.side.values() for a in arrays):
        raise StageNonFiniteError(f"the head computed non-finite embeddings or engram "
                                  f"values (chunk at position {start}); not sent to "
                                  f"stage 0")
    return embedded
