"""What the Needle 3 forward reads of a model: the shared type of a whole model
(`model.V3Model`) and of the part of one a head or a stage holds (`layer_range.V3Part`), in
its own module so the forward's files need not import either (no import
circle)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...formats.needle3_geometry import V3Config
from .numerics import Numerics
from .step import StepPlan
from .weights import V3Weights


class BlockModel(Protocol):
    """Geometry, weights, numerics and the folded per-block constants of a model or part."""

    config: V3Config
    weights: V3Weights
    num: Numerics
    rope_cos: np.ndarray
    rope_sin: np.ndarray

    @property
    def step_plan(self) -> StepPlan: ...
