"""A checkpoint's tensors, checked against the spec and prepared as the block's objects.

`load_weights(checkpoint, spec)` fetches every tensor the spec needs by the family's names
(`names.py`), checks each shape against the config before reading it (a `MissingTensorError` or
`TensorShapeError` names the tensor), and builds the norms (`layers.Norm`) and projections
(`linear.make_linear`). The checkpoint is anything with `names()`, `shape(name)` and
`tensor(name)` (float32): `formats.hf_checkpoint.HFCheckpoint` or
`formats.gguf_checkpoint.GGUFCheckpoint`. Tensors the block does not use (GPT-2's `attn.bias`
mask buffers, cached `rotary_emb.inv_freq`) are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import MissingTensorError, TensorShapeError
from .layers import Norm
from .linear import Linear, make_linear
from .names import NAMES, TensorNames, bias_name
from .spec import BlockSpec

F32 = np.float32


@dataclass
class LayerWeights:
    norm1: Norm
    norm2: Norm
    q: Linear | None  # separate projections, or
    k: Linear | None
    v: Linear | None
    qkv: Linear | None  # one fused q | k | v projection
    o: Linear
    gate: Linear | None  # gated MLP only
    up: Linear
    down: Linear


@dataclass
class TransformerWeights:
    embed: np.ndarray  # [vocab, d]
    positions: np.ndarray | None  # [max_seq_len, d] learned positions
    layers: list[LayerWeights]
    final_norm: Norm
    lm_head: Linear  # d -> vocab (the embedding's transpose when tied)


class _Fetcher:
    """Tensors of one checkpoint under one naming table, shape-checked. The naming prefix
    (GPT-2's optional `transformer.`) is the first under which the embedding exists; the LM
    head sits outside it (`lm_head.weight`)."""

    def __init__(self, checkpoint: Any, names: TensorNames) -> None:
        self.checkpoint = checkpoint
        self.names = names
        present = set(checkpoint.names())
        self.present = present
        self.prefix = next((p for p in names.prefixes if p + names.embed in present),
                           names.prefixes[0])

    def has(self, name: str) -> bool:
        return self.prefix + name in self.present

    def _label(self, full: str) -> str:
        source = getattr(self.checkpoint, "source_name", None)
        stored = source(full) if source is not None else None
        return f"{full!r}" + (f" (stored as {stored!r})" if stored and stored != full else "")

    def get(self, name: str, shape: tuple[int, ...], *, prefixed: bool = True) -> np.ndarray:
        full = self.prefix + name if prefixed else name
        if full not in self.present:
            raise MissingTensorError(f"{self.checkpoint.path}: missing tensor "
                                     f"{self._label(full)}")
        stored = tuple(self.checkpoint.shape(full))
        if stored != tuple(shape):
            raise TensorShapeError(f"{self.checkpoint.path}: tensor {self._label(full)} has "
                                   f"shape {list(stored)}, the config needs {list(shape)}")
        return self.checkpoint.tensor(full)

    def linear(self, name: str, n_in: int, n_out: int, bias: bool) -> Linear:
        shape = (n_in, n_out) if self.names.in_out else (n_out, n_in)
        weight = self.get(name, shape)
        b = self.get(bias_name(name), (n_out,)) if bias else None
        return make_linear(weight, b, in_out=self.names.in_out)

    def norm(self, name: str, spec: BlockSpec) -> Norm:
        d = spec.d_model
        bias = self.get(bias_name(name), (d,)) if spec.norm_bias else None
        return Norm(self.get(name, (d,)), bias, spec.norm_eps, center=spec.norm == "layer")


def _layer(fetch: _Fetcher, spec: BlockSpec, i: int) -> LayerWeights:
    n = fetch.names
    d, q_dim, kv_dim, ff = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ff
    at = lambda template: n.layer(template, i)  # noqa: E731
    q = k = v = qkv = None
    if spec.qkv_fused:
        qkv = fetch.linear(at(n.qkv), d, q_dim + 2 * kv_dim, spec.qkv_bias)
    else:
        q = fetch.linear(at(n.q), d, q_dim, spec.qkv_bias)
        k = fetch.linear(at(n.k), d, kv_dim, spec.qkv_bias)
        v = fetch.linear(at(n.v), d, kv_dim, spec.qkv_bias)
    gate = fetch.linear(at(n.gate), d, ff, spec.mlp_bias) if spec.gated else None
    return LayerWeights(
        norm1=fetch.norm(at(n.norm1), spec),
        norm2=fetch.norm(at(n.norm2), spec),
        q=q, k=k, v=v, qkv=qkv,
        o=fetch.linear(at(n.o), q_dim, d, spec.out_bias),
        gate=gate,
        up=fetch.linear(at(n.up), d, ff, spec.mlp_bias),
        down=fetch.linear(at(n.down), ff, d, spec.mlp_bias),
    )


def load_weights(checkpoint: Any, spec: BlockSpec) -> TransformerWeights:
    """Every tensor `spec` needs, shape-checked, as the block's objects."""
    names = NAMES[spec.architecture]
    fetch = _Fetcher(checkpoint, names)
    d = spec.d_model
    embed = fetch.get(names.embed, (spec.vocab, d))
    positions = fetch.get(names.positions, (spec.max_seq_len, d)) if spec.learned_positions \
        else None
    layers = [_layer(fetch, spec, i) for i in range(spec.num_layers)]
    if spec.tied_embeddings:
        lm_head = make_linear(embed, None, in_out=False)
    else:
        head = fetch.get(names.lm_head, (spec.vocab, d), prefixed=False)
        lm_head = make_linear(head, None, in_out=False)
    return TransformerWeights(
        embed=embed, positions=positions, layers=layers,
        final_norm=fetch.norm(names.final_norm, spec), lm_head=lm_head,
    )
