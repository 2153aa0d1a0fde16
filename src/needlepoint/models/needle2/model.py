"""The Needle 2 model behind `needlepoint.load()` (needle2 README; seeds 000 and 002).

Numerics: Needle 2's reference decoder (upstream `decode._forward_cached`, the path the
shipped engine follows) keeps its KV cache and activations in float32; the header's
`kv_bits = 8` is only the exporter's default (README "Tolerances"). So for a Needle 2
archive both `numerics="deploy"` and `numerics="float"` run the stored (dequantised)
weights with float32 activations and KV cache: "deploy" means what the shipped engine does,
and that is float. The requested value is kept on `model.numerics` for the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ModelInputError, NeedlepointError
from ...formats.cact import CactArchive
from ...formats.needle2_geometry import V2Config
from ..protocol import ModelCapabilities
from ..token_ids import check_token_ids
from ..wrapping import NeedleArchiveText
from .forward import Core, Trace, forward_chunk
from .heads import confidence_logit, contrastive_embedding
from .ladder import ladder_config, ladder_layer_indices
from .session import PREFILL_CHUNK, V2Session, as_token_ids, full_causal_cells
from .weights import V2Weights, load_weights

if TYPE_CHECKING:
    pass


class V2Model(NeedleArchiveText):
    """A loaded Needle 2 model: immutable weights; per-sequence state lives in sessions."""

    generation = 2

    def __init__(self, archive: CactArchive, config: V2Config, core: Core,
                 kept: tuple[int, ...], numerics: str) -> None:
        super().__init__(archive, config, kept)
        self.numerics = numerics
        self._core = core

    @classmethod
    def from_archive(
        cls, archive: CactArchive, *, layers: int | None = None, numerics: str = "deploy"
    ) -> V2Model:
        """Decode the archive's weights once. `layers=N` keeps the N-block ladder rung
        (`config.ladder_layer_indices`); `config` then describes the rung."""
        if numerics not in ("deploy", "float"):
            raise ValueError(f"numerics must be 'deploy' or 'float', got {numerics!r}")
        full: V2Config = archive.config
        if layers is None:
            kept = tuple(range(full.num_layers))
        else:
            kept = ladder_layer_indices(full.num_layers, layers)
        rung = ladder_config(full, kept)
        core = Core.build(rung, load_weights(archive, full, rung, kept))
        return cls(archive, rung, core, kept, numerics)

    @property
    def weights(self) -> V2Weights:
        """The decoded weights (read-only by convention)."""
        return self._core.weights

    @property
    def has_confidence_head(self) -> bool:
        return self._core.weights.confidence is not None

    @property
    def capabilities(self) -> ModelCapabilities:
        """What this model offers beyond the core interface (`models/protocol.py`)."""
        return ModelCapabilities(run_batch=True, confidence_head=self.has_confidence_head,
                                 embedding=self.has_contrastive_head,
                                 name=self.archive.path.stem)

    @property
    def has_contrastive_head(self) -> bool:
        return self._core.weights.contrastive is not None

    def check_ids(self, ids: object, position: int = 0) -> np.ndarray:
        """Token ids as int64, or a ModelInputError naming what is wrong (`token_ids`)."""
        return check_token_ids(ids, self.config.vocab, self.config.max_seq_len, position)

    def run_batch(self, requests: Sequence[tuple[V2Session, object, bool]]
                  ) -> list[np.ndarray | None]:
        """Per request (session, ids, all_logits): append ids to that session; its logits
        ([len(ids), vocab] if all_logits, else the last row), each session run on its own."""
        return [session.extend(ids) if every else session.prefill(ids)
                for session, ids, every in requests]

    def session(
        self,
        kv_window: int | None = None,
        *,
        cache_len: int | None = None,
        trace: Trace | None = None,
    ) -> V2Session:
        """A fresh, independent decode state. `kv_window=None` is the archive's window (the
        reference decoder's), 0 full causal. The KV ring holds `cache_len` positions
        (default: what the window needs; max_seq_len for full causal)."""
        window = self.config.kv_window if kv_window is None else kv_window
        return V2Session(self._core, window, cache_len=cache_len, trace=trace)

    def forward(
        self, ids: object, *, kv_window: int | None = None, trace: Trace | None = None
    ) -> np.ndarray:
        """Logits at every position, `[len(ids), vocab]`, batched, with the archive's window
        mask (as the reference) unless `kv_window` says otherwise."""
        tokens = self._check_length(ids)
        window = self.config.kv_window if kv_window is None else kv_window
        session = V2Session(self._core, window, max_tokens=tokens.size, trace=trace)
        return session.prefill_all(tokens)

    def hidden_cells(self, ids: object) -> np.ndarray:
        """Probe-head cells `[S, L+1, C]` of a full-causal pass over `ids` (README "Probe
        heads": the heads run at window 0, upstream's default, even though the LM is
        windowed). The LM head is skipped."""
        return full_causal_cells(self._core, self._check_length(ids))

    def confidence_logit(self, ids: object) -> float | None:
        """The confidence head's logit over `ids` (full causal); None if the archive has no
        confidence head."""
        head = self._core.weights.confidence
        if head is None:
            return None
        return confidence_logit(self.hidden_cells(ids), head)

    def embed(self, text_or_ids: str | object) -> np.ndarray:
        """The contrastive head's L2-normalised embedding (full causal). A str is scored as
        `[BOS] + encode(text)`, as the fixtures and needle-rs do."""
        head = self._core.weights.contrastive
        if head is None:
            raise NeedlepointError(f"{self.archive.path.name} has no contrastive head")
        if isinstance(text_or_ids, str):
            tok = self.tokenizer
            ids: object = [tok.bos_id, *tok.encode(text_or_ids)]
        else:
            ids = text_or_ids
        return contrastive_embedding(self.hidden_cells(ids), head)

    def _check_length(self, ids: object) -> np.ndarray:
        tokens = as_token_ids(ids, self.config.vocab)
        if tokens.size > self.config.max_seq_len:
            raise ModelInputError(
                f"{tokens.size} tokens exceed max_seq_len {self.config.max_seq_len}"
            )
        return tokens

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"V2Model({self.archive.path.name!r}, {cfg.num_layers} layers, d {cfg.d_model}, "
            f"vocab {cfg.vocab}, kv_window {cfg.kv_window})"
        )


__all__ = ["PREFILL_CHUNK", "V2Model", "V2Session", "forward_chunk"]
