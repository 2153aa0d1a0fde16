"""A Needle 3 model cut at block boundaries into stages, in this process or on Ray actors
across machines (docs/distributed.md): `load_staged(path, stages=...)`, which
`needlepoint.load(path, stages=..., transport=..., ray_address=...)` calls.

Layers: this package sits beside `generation/` (above `models/`, `formats/`, `kernels/`);
`api/`, `cli/` and `server/` may import it, `models/` never does.
"""

from __future__ import annotations

from .memory import rss_bytes
from .model import TRANSPORTS, StagedModel, load_staged
from .plan import StagePlan, StageRange, plan_stages
from .session import StagedSession

__all__ = ["TRANSPORTS", "StagePlan", "StageRange", "StagedModel", "StagedSession",
           "load_staged", "plan_stages", "rss_bytes"]
