"""Needle 3 model: weights decoded once, shared read-only by any number of sessions.

`V3Model.from_archive(archive, layers=None, numerics="deploy", cache=None)` is what
`needlepoint.load` calls; `cache` switches the prepared-weight cache (`weight_cache`).
Numerics (fixture README "Deploy quantization"): `"deploy"` applies upstream's A8 fake
quantisation at the CQ-matmul inputs and on q/k/v (int8 KV); `"float"` runs the stored weights
with no activation quantisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from ...errors import ModelInputError
from ...formats.cact import CactArchive
from ...formats.needle3_geometry import V3Config
from ..protocol import ModelCapabilities
from ..token_ids import check_token_ids
from ..wrapping import NeedleArchiveText
from .batch import run_batch
from .cache import new_caches
from .forward import Collector, joined, run_chunks
from .ladder import ladder_config, ladder_layer_indices
from .numerics import Numerics
from .numerics import numerics as make_numerics
from .session import CHUNK, Trace, V3Session
from .step import StepPlan, build_plan
from .weights import V3Weights, load_weights


class V3Model(NeedleArchiveText):
    """A loaded Needle 3 model (optionally a ladder rung). Use `needlepoint.load`."""

    def __init__(self, archive: CactArchive, config: V3Config, weights: V3Weights,
                 layer_indices: tuple[int, ...], num: Numerics) -> None:
        super().__init__(archive, config, layer_indices)
        self.weights = weights
        self.num = num  # the numerics strategy, chosen once at load (`numerics.py`)
        self.numerics = num.name
        self.exact = num.exact  # exact numerics (`numerics.py`): the one name for it
        self.threads = num.threads  # native threads of the deploy products
        cos, sin = num.rope_tables(np.arange(config.max_seq_len), config.qk_head_dim,
                                   config.rope_theta)
        self.rope_cos, self.rope_sin = cos, sin
        for array in (cos, sin):
            array.setflags(write=False)

    @classmethod
    def from_archive(
        cls,
        archive: CactArchive,
        *,
        layers: int | None = None,
        numerics: str = "deploy",
        cache: bool | None = None,
        threads: int = 1,
    ) -> V3Model:
        """Prepare the weights of `archive` (the `layers`-deep ladder rung if given), from the
        weight cache when one is valid (`cache=None`: unless NEEDLEPOINT_CACHE=0)."""
        num = make_numerics(numerics, threads)  # raises on an unknown name
        full = archive.config
        depth = full.num_layers if layers is None else int(layers)
        kept = ladder_layer_indices(full.num_layers, depth)
        config = ladder_config(full, kept)
        weights = load_weights(archive, config, kept, cache=cache, products=num.products())
        return cls(archive, config, weights, kept, num)

    @cached_property
    def step_plan(self) -> StepPlan:
        """Constants folded once per model (`step.py`), on first use."""
        return build_plan(self.config, self.weights.layers, self.rope_cos, self.rope_sin)

    @property
    def has_confidence_head(self) -> bool:
        return self.weights.confidence is not None

    @property
    def capabilities(self) -> ModelCapabilities:
        """What this model offers beyond the core interface (`models/protocol.py`)."""
        return ModelCapabilities(run_batch=True, confidence_head=self.has_confidence_head,
                                 name=self.archive.path.stem)

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        """Token ids as int64, or a ModelInputError naming what is wrong (`token_ids`)."""
        return check_token_ids(ids, self.config.vocab, self.config.max_seq_len, position)

    def session(
        self, kv_window: int | None = None, *, trace: Trace | None = None, chunk: int = CHUNK
    ) -> V3Session:
        """A fresh, independent decode state. `kv_window=config.kv_window` bounds every layer
        to the archive's kv window (ring buffers), as the shipped engine does; `chunk` is the
        prefill chunk size (deploy numerics give the same bits for every chunk size)."""
        return V3Session(self, kv_window=kv_window, trace=trace, chunk=chunk)

    def run_batch(self, requests: Sequence[tuple[V3Session, Sequence[int] | np.ndarray, bool]]):
        """Continuous batching: per request (session, ids, all_logits), append ids to that
        session and return its logits ([len(ids), vocab] if all_logits, else the last row),
        all sessions' chunks in one stacked pass per round (`batch.run_batch`); in deploy
        numerics each request's logits are the same bits as running it alone."""
        return run_batch(self, requests)

    def forward(
        self, ids: Sequence[int] | np.ndarray, *, trace: Trace | None = None
    ) -> np.ndarray:
        """Logits [len(ids), vocab_out] at every position (full causal attention, batched):
        the batch forward over fresh caches, in chunks of CHUNK positions."""
        tokens = self.check_ids(ids)
        collect = Collector() if trace is not None else None
        outputs = [logits for _, logits in run_chunks(
            self, tokens, tokens[:0], *self._fresh_state(), None, CHUNK, "all", collect)]
        if collect is not None:
            collect.emit(trace)
        return joined(outputs)

    def confidence_logit(self, ids: Sequence[int] | np.ndarray) -> float | None:
        """Confidence-head logit over the whole sequence (full causal attention); None if the
        archive has no head. The batch forward over fresh caches, no logits."""
        tokens = self.check_ids(ids)
        if not self.has_confidence_head:
            return None
        if not len(tokens):
            raise ModelInputError("confidence_logit: no tokens given")
        cells = self.num.cell_state(self.weights.confidence)
        for _ in run_chunks(self, tokens, tokens[:0], *self._fresh_state(), cells, CHUNK,
                            "none"):
            pass
        return cells.logit()

    def _fresh_state(self) -> tuple[list, object]:
        """A new sequence's caches (full causal) and engram state, for the forward."""
        caches = new_caches(self.config, self.num.cache_type,
                            [layer.window for layer in self.weights.layers], None)
        return caches, self.num.engram_state(self.config, len(self.weights.engram))

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"V3Model({self.archive.path.name}, d={cfg.d_model}, layers={cfg.num_layers}"
            f"{'' if self.layer_indices == tuple(range(cfg.num_layers)) else ' (rung)'}, "
            f"vocab={cfg.vocab}, numerics={self.numerics!r})"
        )
