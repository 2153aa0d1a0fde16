"""What a staged session and the pipeline need of the model they run on.

`StagedModel` (model.py) builds sessions (session.py) and calls the pipeline (pipeline.py);
they in turn read the model's head part, stage plan and transport. This Protocol names that
much, so session.py and pipeline.py import it from here and model.py imports them: the
imports run one way, type-only ones included, with no circle through model.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..models.layer_range import LayerRange
from .plan import StagePlan


class StagedModelView(Protocol):
    """The part of `StagedModel` its sessions and the pipeline use."""

    part: LayerRange  # the head's part: embedding, readout, head state, id checks
    plan: StagePlan  # the stages' layer ranges
    transport: Any  # local.LocalTransport or ray_transport.RayTransport: submit/gather/call_all

    def confidence_logit(self, ids: Sequence[int] | np.ndarray) -> float | None:
        """Confidence-head logit over a whole sequence (None without the head)."""
        ...
