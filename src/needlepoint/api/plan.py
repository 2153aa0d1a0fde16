"""How one turn decodes (`TurnPlanner.plan` in `planner.py`): its config and constraints."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..generation.grammar import ToolCallGrammar
from ..generation.turn_config import GenerationConfig


@dataclasses.dataclass
class Plan:
    """How one turn decodes: its config and constraints, and what to add to its envelope."""

    config: GenerationConfig
    grammar: ToolCallGrammar | None
    content: Any = None
    check_tools: list[dict[str, Any]] | None = None
    parallel: bool = True
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
