"""A Llama-family, Qwen2/3, Gemma 3 or GPT-2 model from a Hugging Face directory or a GGUF file.

Same interface as the Needle models (`needle3/model.py`): `forward(ids)` gives logits
[len(ids), vocab] float32, `session()` an independent decode state (`prefill`, `step`),
`config.vocab` / `config.max_seq_len`, `tokenizer`; plus `hidden_states(ids)` (transformers'
`output_hidden_states`, the last after the final norm). Numerics: a strategy chosen once here
(`numerics.py`): "float" (the stored weights, GGUF quantised tensors dequantised to float32,
float32 activations and cache) or "int8" (every product through the block-scaled int8 units of
`kernels.i8`, pinned elementwise parts, int8 KV cache); "deploy" is int8 (docs/hf.md
"Numerics"). Everything runs through the one forward, `runner.Runner`.
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
from ..protocol import ModelCapabilities
from ..token_ids import check_kv_window
from .numerics import TransformerNumerics, numerics_named
from .runner import CHUNK, Request, Runner
from .session import TransformerSession, run_sessions
from .spec import BlockSpec, spec_from_config
from .weights import TransformerWeights, load_weights


def model_spec(checkpoint: Any, layers: int | None) -> BlockSpec:
    """The spec of an opened checkpoint, cut to its first `layers` blocks if given."""
    spec = spec_from_config(checkpoint.config)
    if layers is not None:
        if not 1 <= int(layers) <= spec.num_layers:
            raise ValueError(f"layers must be in 1..{spec.num_layers}, got {layers}")
        spec = spec.with_layers(int(layers))
    return spec


class TransformerModel:
    """Weights prepared once, shared read-only by any number of sessions."""

    def __init__(self, checkpoint: Any, spec: BlockSpec, weights: TransformerWeights,
                 numerics: TransformerNumerics) -> None:
        self.checkpoint = checkpoint
        self.config = spec
        self.weights = weights
        self.numerics = numerics.name
        self.runner = Runner(spec, weights, numerics)

    @property
    def fused(self) -> bool:
        """int8: run each block in one native call when it is built (False: kernel by
        kernel from Python, same bits)."""
        return self.runner.fused

    @fused.setter
    def fused(self, value: bool) -> None:
        self.runner.fused = value

    @property
    def fused_blocks(self) -> list | None:
        return self.runner.fused_blocks

    def native_blocks(self) -> list | None:
        return self.runner.native_blocks()

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, *, layers: int | None = None,
                        numerics: str = "float", threads: int = 1,
                        cache: bool | None = None) -> TransformerModel:
        """The model of an opened checkpoint (`layers=N`: only its first N blocks;
        `numerics` "float" or "int8"/"deploy"; `threads` for the int8 kernels; `cache` the
        int8 weight cache, `int8_cache.py`)."""
        strategy = numerics_named(numerics, threads)
        spec = model_spec(checkpoint, layers)
        weights = load_weights(checkpoint, spec, strategy, cache=cache)
        return cls(checkpoint, spec, weights, strategy)

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
        return self.runner.check_ids(ids, position)

    def session(self, kv_window: int | None = None, *, chunk: int = CHUNK
                ) -> TransformerSession:
        """An independent decode state; prefill runs in chunks of `chunk` positions.
        `kv_window` as `models.protocol.ModelProtocol.session`: None or 0 is the model's own
        attention span (its layers' windows, up to `max_seq_len`); a window shorter than that
        is not supported by these models (ModelInputError)."""
        check_kv_window(kv_window, self.config.max_seq_len)
        return TransformerSession(self, chunk)

    def run_batch(self, requests: Sequence[tuple[TransformerSession, Sequence[int], bool]]
                  ) -> list[np.ndarray | None]:
        """Per request (session, ids, all_logits): append ids to that session; its logits
        ([len(ids), vocab] if all_logits, else the last row). One batch forward over the
        sessions' caches (rows are independent in int8 numerics, so the bits equal running
        each alone)."""
        items = [(session, ids, "all" if every else "last", None)
                 for session, ids, every in requests]
        out = run_sessions(self.runner, items)
        return [logits if every or logits is None else logits[-1]
                for logits, (_, _, every) in zip(out, requests, strict=True)]

    @cached_property
    def chat_format(self) -> Any:
        """The model's chat format: its chat template, with a Hermes-style tool prompt when
        the template renders no tools (`formats/chat_format.py`)."""
        return TemplateFormat(self.tokenizer)

    def forward(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Logits [len(ids), vocab] at every position (causal attention, fresh caches)."""
        tokens = self.check_ids(ids)
        return self.runner.run([Request(self.runner.new_caches(), tokens, 0, "all")])[0]

    def hidden_states(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """[L+1, T, d]: the embedding output, the residual after each block but the last, and
        the last block's output after the final norm (transformers' layout)."""
        parts: list[np.ndarray] = []
        tokens = self.check_ids(ids)
        self.runner.run([Request(self.runner.new_caches(), tokens, 0, "none", CHUNK, parts)])
        return np.concatenate(parts, axis=1)

    def __repr__(self) -> str:
        spec = self.config
        return (f"TransformerModel({Path(str(self.checkpoint.path)).name}, {spec.architecture}, "
                f"{self.numerics}, "
                f"d={spec.d_model}, layers={spec.num_layers}, heads={spec.num_heads}/"
                f"{spec.num_kv_heads}, vocab={spec.vocab})")


def load_transformer(
    path: str | os.PathLike[str], *, layers: int | None = None, numerics: str = "float",
    threads: int = 1, cache: bool | None = None,
) -> TransformerModel:
    """A Hugging Face model directory or a `.gguf` file as a model (`numerics`: "float", or
    "int8" = "deploy"; `threads`: CPU threads of the int8 products, same bits for any;
    `cache`: the int8 weight cache, `int8_cache.py`)."""
    numerics_named(numerics)  # a bad name fails before the file is opened
    return TransformerModel.from_checkpoint(open_checkpoint(path), layers=layers,
                                            numerics=numerics, threads=threads, cache=cache)
