"""A Llama-family or GPT-2 model from a Hugging Face directory or a GGUF file.

Same interface as the Needle models (`needle3/model.py`): `forward(ids)` gives logits
[len(ids), vocab] float32, `session()` an independent decode state (`prefill`, `step`),
`config.vocab` / `config.max_seq_len`, `tokenizer`; plus `hidden_states(ids)` (transformers'
`output_hidden_states`, the last after the final norm). Numerics: "float" (the stored weights,
GGUF quantised tensors dequantised to float32, float32 activations and cache) or "int8" (every
product through the block-scaled int8 units of `kernels.i8`, pinned elementwise parts, int8 KV
cache: `int8.py`); "deploy" is int8 (docs/hf.md "Numerics").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ...formats.chat_format import TemplateFormat
from ...formats.checkpoints import open_checkpoint
from ...kernels import i8_native
from ..protocol import ModelCapabilities
from ..token_ids import check_kv_window, check_token_ids
from .block import block_forward
from .int8 import RopeTable
from .int8_fused import FusedBlock, address, fused_blocks, rope_arrays
from .layers import rope_angles
from .session import CHUNK, TransformerSession
from .spec import BlockSpec, spec_from_config
from .weights import TransformerWeights, load_weights

NUMERICS = ("deploy", "float", "int8")


class TransformerModel:
    """Weights prepared once, shared read-only by any number of sessions."""

    def __init__(self, checkpoint: Any, spec: BlockSpec, weights: TransformerWeights) -> None:
        self.checkpoint = checkpoint
        self.config = spec
        self.weights = weights
        self.numerics = weights.numerics
        self._rope = RopeTable(spec.head_dim, spec.rope_theta) \
            if spec.rope and self.numerics == "int8" else None
        self.fused = True  # int8: run each block in one native call when it is built

    @cached_property
    def fused_blocks(self) -> list[FusedBlock | None] | None:
        """The int8 blocks as single native calls (None: float, or no native library)."""
        return fused_blocks(self.config, self.weights)

    def native_blocks(self) -> list[FusedBlock | None] | None:
        """The fused blocks a chunk runs now: None when `fused` is off or the native int8
        library is not (or no longer) loaded, and every block runs `block_forward`."""
        if not self.fused or i8_native.LIBRARY is None:
            return None
        return self.fused_blocks

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, *, layers: int | None = None,
                        numerics: str = "float", threads: int = 1) -> TransformerModel:
        """The model of an opened checkpoint (`layers=N`: only its first N blocks;
        `numerics` "float" or "int8"/"deploy"; `threads` for the int8 kernels)."""
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
        spec = spec_from_config(checkpoint.config)
        if layers is not None:
            if not 1 <= int(layers) <= spec.num_layers:
                raise ValueError(f"layers must be in 1..{spec.num_layers}, got {layers}")
            spec = spec.with_layers(int(layers))
        kind = "float" if numerics == "float" else "int8"
        return cls(checkpoint, spec, load_weights(checkpoint, spec, kind, threads))

    def rope(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """RoPE cos, sin [count, head_dim] of positions start..start+count-1."""
        if self._rope is not None:
            return self._rope(start, count)
        return rope_angles(start, count, self.config.head_dim, self.config.rope_theta)

    @cached_property
    def tokenizer(self) -> Any:
        return self.checkpoint.tokenizer

    @property
    def has_confidence_head(self) -> bool:
        return False

    @property
    def capabilities(self) -> ModelCapabilities:
        """What this model offers beyond the core interface (`models/protocol.py`)."""
        return ModelCapabilities(run_batch=True, name=Path(self.checkpoint.path).stem)

    def confidence_logit(self, ids: Sequence[int] | np.ndarray) -> None:
        """No confidence head on these models (the Needle interface's answer: None)."""
        self.check_ids(ids)
        return None

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        """Token ids as int64, or a ModelInputError naming what is wrong (`token_ids`)."""
        return check_token_ids(ids, self.config.vocab, self.config.max_seq_len, position)

    def embed(self, tokens: np.ndarray, start: int) -> np.ndarray:
        """Block input [T, d] of tokens at positions start.. (learned positions added)."""
        h = np.array(self.weights.embed[tokens], np.float32)
        if self.weights.positions is not None:
            h += self.weights.positions[start : start + len(tokens)]
        return h

    def run_layers(self, first: int, end: int, h: np.ndarray, state: Any, start: int,
                   side: Any = None, states: list | None = None) -> np.ndarray:
        """The residual rows h [T, d] (positions start..) after blocks first..end-1; `state`
        holds their caches (`state.caches[i]`, advanced in place); `states`, if given,
        receives each block's output. The one forward loop of the family: a session runs
        it over every block, a stage (`layer_range.py`) over its range."""
        spec, layers = self.config, self.weights.layers
        rope = self.rope(start, len(h)) if spec.rope else None
        fused = self.native_blocks()
        if fused is not None and states is None and end > first:
            # one copy of the caller's rows, every block on it in place, addresses taken once
            h = np.array(h, np.float32, order="C", copy=True)
            cos, sin = rope_arrays(rope)
            at, cos_at, sin_at = h.ctypes.data, address(cos), address(sin)
            for index in range(first, end):
                fused[index].run(h, at, state.caches[index], start, cos_at, sin_at)
            return h
        for index in range(first, end):
            cache = state.caches[index]
            if fused is not None:
                h = fused[index](h, cache, start, rope)
            else:
                h = block_forward(spec, layers[index], index, h, cache, start, rope)
            if states is not None:
                states.append(h)
        return h

    def session(self, kv_window: int | None = None, *, chunk: int = CHUNK
                ) -> TransformerSession:
        """An independent decode state; prefill runs in chunks of `chunk` positions.
        `kv_window` as `models.protocol.ModelProtocol.session`: None or 0 is the model's own
        attention span (full causal, up to `max_seq_len`); a window shorter than that is
        not supported by these models (ModelInputError)."""
        check_kv_window(kv_window, self.config.max_seq_len)
        return TransformerSession(self, chunk)

    def run_batch(self, requests: Sequence[tuple[TransformerSession, Sequence[int], bool]]
                  ) -> list[np.ndarray | None]:
        """Per request (session, ids, all_logits): append ids to that session; its logits
        ([len(ids), vocab] if all_logits, else the last row). Each runs on its own session
        (rows are independent in int8 numerics, so the bits equal running it alone)."""
        out: list[np.ndarray | None] = []
        for session, ids, all_logits in requests:
            logits = session.run(ids, "all" if all_logits else "last")
            out.append(logits if all_logits or logits is None else logits[-1])
        return out

    @cached_property
    def chat_format(self) -> Any:
        """The model's chat format: its chat template, with a Hermes-style tool prompt when
        the template renders no tools (`formats/chat_format.py`)."""
        return TemplateFormat(self.tokenizer)

    def forward(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Logits [len(ids), vocab] at every position (full causal attention)."""
        return TransformerSession(self).run(ids, "all")

    def hidden_states(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """[L+1, T, d]: the embedding output, the residual after each block but the last, and
        the last block's output after the final norm (transformers' layout)."""
        parts: list[np.ndarray] = []
        TransformerSession(self).run(ids, "none", hidden=parts)
        return np.concatenate(parts, axis=1)

    def __repr__(self) -> str:
        spec = self.config
        source = getattr(self.checkpoint, "path", "")
        return (f"TransformerModel({Path(str(source)).name}, {spec.architecture}, "
                f"{self.numerics}, "
                f"d={spec.d_model}, layers={spec.num_layers}, heads={spec.num_heads}/"
                f"{spec.num_kv_heads}, vocab={spec.vocab})")


def load_transformer(
    path: str | os.PathLike[str], *, layers: int | None = None, numerics: str = "float",
    threads: int = 1,
) -> TransformerModel:
    """A Hugging Face model directory or a `.gguf` file as a model (`numerics`: "float", or
    "int8" = "deploy"; `threads`: CPU threads of the int8 products, same bits for any)."""
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    return TransformerModel.from_checkpoint(open_checkpoint(path), layers=layers,
                                            numerics=numerics, threads=threads)
