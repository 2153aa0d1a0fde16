"""Collect a traced forward into the fixture's parity-ladder layout (needle2 README
"Parity ladder"), so a divergence can be located stage by stage.

`forward.forward_chunk` reports per chunk and, for per-layer stages, once per layer; this
recorder stacks layers and concatenates chunks along the position axis, giving arrays
shaped like `p{k}_ladder_*` (without the `p{k}_` prefix) plus `logits`.
"""

from __future__ import annotations

import numpy as np

# Stages reported once per layer (stacked on a new leading axis), including `ladder_lanes`
# which is reported L + 1 times, and the per-site engram gate.
PER_LAYER = (
    "ladder_lanes",
    "ladder_hpre",
    "ladder_hpost",
    "ladder_hres",
    "ladder_engram_alpha",
    "ladder_block_in",
    "ladder_attn_out",
    "ladder_mlp_out",
    "ladder_block_out",
)
# Stages whose position axis is axis 1 as reported ([sites or KV, T, ...]).
POSITION_AXIS_1 = ("ladder_engram_k", "ladder_engram_v", "ladder_k_cache_l0", "ladder_v_cache_l0")
CHUNK_START = "ladder_embedding_rows"


class LadderRecorder:
    """A `trace=` callback; `arrays()` returns the stacked ladder, `order` the call names."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self._chunks: list[dict[str, list[np.ndarray]]] = []

    def __call__(self, name: str, value: np.ndarray) -> None:
        if name == CHUNK_START or not self._chunks:
            self._chunks.append({})
        self.order.append(name)
        self._chunks[-1].setdefault(name, []).append(np.asarray(value))

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, list[np.ndarray]] = {}
        for chunk in self._chunks:
            for name, values in chunk.items():
                if name in PER_LAYER:
                    out.setdefault(name, []).append(np.stack(values))
                else:
                    out.setdefault(name, []).append(values[0])
        merged = {}
        for name, parts in out.items():
            axis = 1 if name in PER_LAYER or name in POSITION_AXIS_1 else 0
            merged[name] = np.concatenate(parts, axis=axis)
        return merged
