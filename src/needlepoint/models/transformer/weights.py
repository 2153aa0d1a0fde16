"""A checkpoint's tensors, checked against the spec and prepared as the block's objects.

`load_weights(checkpoint, spec)` fetches every tensor the spec needs by the architecture's
names (`formats/arch/<name>.py`), checks each shape against the config before reading it (a
`MissingTensorError` or `TensorShapeError` names the tensor), and builds the norms
(`layers.Norm`) and projections (`linear.make_linear`). The checkpoint is a
`formats.checkpoints.TensorCheckpoint`: `formats.hf_checkpoint.HFCheckpoint` or
`formats.gguf_checkpoint.GGUFCheckpoint` (whose `stored_weight` hands over its own blocks).
Tensors the block does not use (GPT-2's `attn.bias` mask buffers, cached
`rotary_emb.inv_freq`) are ignored.

What each object is comes from the numerics strategy (`numerics.py`): int8 builds
`PinnedNorm`s and `Int8Linear`s (`int8.py`, `linear.py`): a checkpoint with `blocks(name)`
(GGUF) hands over every weight of an integer ggml type (`kernels.wtypes`) as the file stores
it, multiplied in place (`kernels.blockweight`); every float weight (safetensors, GGUF
F16 / BF16 / F32) is quantised to int8 per block of 32 inputs at load, once: later loads map
the int8 weight cache (`int8_cache.py`, `_Fetcher.converted`).
q | k | v and gate | up are joined (one input quantisation each). Norm weights applied as
`1 + w` (Gemma, `spec.norm_offset`) are added here, once, in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import MissingTensorError, TensorShapeError
from ...formats.arch.base import TensorNames, bias_name
from ...formats.arch.registry import by_name
from ...formats.checkpoints import TensorCheckpoint
from ...kernels.blockweight import BlockWeight
from ..weight_cache import enabled
from .int8 import BlockEmbedding, PinnedNorm
from .int8_cache import Int8Store, open_store
from .layers import Norm
from .linear import Int8Linear, Linear
from .spec import BlockSpec

F32 = np.float32


@dataclass
class LayerWeights:
    norm1: Norm | PinnedNorm
    norm2: Norm | PinnedNorm
    q: Linear | None  # separate projections, or
    k: Linear | None
    v: Linear | None
    qkv: Linear | None  # one fused q | k | v projection
    o: Linear
    gate: Linear | None  # gated MLP only
    up: Linear | None  # None when fused into gate_up
    down: Linear
    gate_up: Int8Linear | None = None  # int8: one fused gate | up projection
    act: Any = None  # the MLP activation of the numerics (`numerics.activation`)
    q_norm: Norm | PinnedNorm | None = None  # per head, before RoPE (spec.qk_norm)
    k_norm: Norm | PinnedNorm | None = None
    attn_out_norm: Norm | PinnedNorm | None = None  # on the outputs (spec.output_norms)
    mlp_out_norm: Norm | PinnedNorm | None = None

    def linears(self) -> tuple[Linear | Int8Linear | None, ...]:
        """Every projection slot (None where this block's layout has none)."""
        return (self.qkv, self.q, self.k, self.v, self.o, self.gate, self.up, self.down,
                self.gate_up)


@dataclass
class TransformerWeights:
    embed: np.ndarray | BlockEmbedding | None  # [vocab, d] (None: a part without the head)
    positions: np.ndarray | None  # [max_seq_len, d] learned positions
    layers: list[LayerWeights | None]  # None: a block another part holds (layer_range.py)
    final_norm: Norm | PinnedNorm | None
    lm_head: Linear | Int8Linear | None  # d -> vocab (the embedding's transpose when tied)
    numerics: str = "float"

    @property
    def nbytes(self) -> int:
        """Bytes of int8 weights held (0 for float weights)."""
        linears = [self.lm_head] + [lin for layer in self.layers if layer is not None
                                    for lin in layer.linears()]
        return sum(lin.nbytes for lin in linears if isinstance(lin, Int8Linear))


class _Fetcher:
    """Tensors of one checkpoint under one naming table, shape-checked. The naming prefix
    (GPT-2's optional `transformer.`) is the first under which the embedding exists; the LM
    head sits outside it (`lm_head.weight`)."""

    def __init__(self, checkpoint: TensorCheckpoint, names: TensorNames, numerics: Any,
                 store: Int8Store | None = None) -> None:
        self.checkpoint = checkpoint
        self.names = names
        self.numerics = numerics
        self.store = store
        present = set(checkpoint.names())
        self.present = present
        self.prefix = next((p for p in names.prefixes if p + names.embed in present),
                           names.prefixes[0])

    def full_name(self, name: str, prefixed: bool = True) -> str:
        return self.prefix + name if prefixed else name

    def converted(self, key: str, n_out: int, k_in: int, build: Callable[[], Any]) -> Any:
        """A weight converted at load (`build()`: int8 blocks of a float tensor), or the same
        weight from the int8 weight cache when one is open (`int8_cache.Int8Store`)."""
        return build() if self.store is None else self.store.weight(key, n_out, k_in, build)

    def has(self, name: str) -> bool:
        return self.prefix + name in self.present

    def _label(self, full: str) -> str:
        stored = self.checkpoint.source_name(full)
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

    def stored(self, name: str, n_in: int, n_out: int, *, prefixed: bool = True
               ) -> BlockWeight | None:
        """The weight `[n_out, n_in]` as the file stores it (`GGUFCheckpoint.stored_weight`:
        its own blocks, in place), or None (a float or non-integer type, a checkpoint that
        stores none, or another shape: the float tensor then goes through `get`)."""
        full = self.prefix + name if prefixed else name
        if full not in self.present:
            return None
        found = self.checkpoint.stored_weight(full, self.numerics.threads)
        if found is None or (found.n_out, found.k_in) != (n_out, n_in):
            return None
        return found

    def linear(self, name: str, n_in: int, n_out: int, bias: bool,
               prefixed: bool = True) -> Linear | Int8Linear:
        b = self.get(bias_name(name), (n_out,), prefixed=prefixed) if bias else None
        found = self.numerics.stored(lambda: self.stored(name, n_in, n_out, prefixed=prefixed),
                                     b)
        if found is not None:
            return found
        shape = (n_in, n_out) if self.names.in_out else (n_out, n_in)
        return self.numerics.linear(self, name, shape, b, prefixed)

    def norm(self, name: str, spec: BlockSpec, width: int | None = None) -> Norm | PinnedNorm:
        """A norm over `width` (default d_model) values; its weight plus `spec.norm_offset`."""
        d = spec.d_model if width is None else width
        bias = self.get(bias_name(name), (d,)) if spec.norm_bias else None
        weight = self.get(name, (d,))
        if spec.norm_offset:
            weight = np.asarray(weight, F32) + F32(spec.norm_offset)
        return self.numerics.norm(weight, bias, spec.norm_eps, spec.norm == "layer")


def _layer(fetch: _Fetcher, spec: BlockSpec, i: int) -> LayerWeights:
    n, numerics = fetch.names, fetch.numerics
    d, q_dim, kv_dim, ff = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ff
    at = lambda template: n.layer(template, i)  # noqa: E731
    q = k = v = qkv = None
    if spec.qkv_fused:
        qkv = fetch.linear(at(n.qkv), d, q_dim + 2 * kv_dim, spec.qkv_bias)
    else:
        q = fetch.linear(at(n.q), d, q_dim, spec.qkv_bias)
        k = fetch.linear(at(n.k), d, kv_dim, spec.qkv_bias)
        v = fetch.linear(at(n.v), d, kv_dim, spec.qkv_bias)
        joined = numerics.join([q, k, v])
        if joined is not None:
            qkv, q, k, v = joined, None, None, None
    gate = fetch.linear(at(n.gate), d, ff, spec.mlp_bias) if spec.gated else None
    up = fetch.linear(at(n.up), d, ff, spec.mlp_bias)
    gate_up = None if gate is None else numerics.join([gate, up])
    if gate_up is not None:
        gate, up = None, None
    head_norm = (lambda t: fetch.norm(at(t), spec, spec.head_dim)) if spec.qk_norm else None
    out_norm = (lambda t: fetch.norm(at(t), spec)) if spec.output_norms else None
    return LayerWeights(
        norm1=fetch.norm(at(n.norm1), spec),
        norm2=fetch.norm(at(n.norm2), spec),
        q=q, k=k, v=v, qkv=qkv,
        o=fetch.linear(at(n.o), q_dim, d, spec.out_bias),
        gate=gate, up=up,
        down=fetch.linear(at(n.down), ff, d, spec.mlp_bias),
        gate_up=gate_up, act=numerics.activation(spec.activation),
        q_norm=None if head_norm is None else head_norm(n.q_norm),
        k_norm=None if head_norm is None else head_norm(n.k_norm),
        attn_out_norm=None if out_norm is None else out_norm(n.attn_out_norm),
        mlp_out_norm=None if out_norm is None else out_norm(n.mlp_out_norm),
    )


def load_weights(checkpoint: TensorCheckpoint, spec: BlockSpec, numerics: Any,
                 blocks: range | None = None, head: bool = True,
                 cache: bool | None = None) -> TransformerWeights:
    """Every tensor `spec` needs, shape-checked, as the block's objects built by `numerics`
    (a `numerics.TransformerFloat` / `TransformerInt8`). A part of the model
    (`layer_range.py`): `blocks` only those blocks (the others None), `head=False` no
    embedding, positions, final norm or LM head. `cache`: keep the float weights' int8
    conversion in the int8 weight cache (`int8_cache.py`; None: on unless
    NEEDLEPOINT_CACHE=0; int8 numerics only)."""
    names = by_name(spec.architecture).names
    blocks = range(spec.num_layers) if blocks is None else blocks
    store = None
    if numerics.copies_weights and enabled(cache):
        part = (f"{spec.architecture}|{spec.num_layers} layers|blocks {blocks.start}-"
                f"{blocks.stop}|head {head}|{numerics.name}")
        store = open_store(checkpoint.source_files(), Path(checkpoint.path).name, part, cache,
                           numerics.threads)
    fetch = _Fetcher(checkpoint, names, numerics, store)
    d = spec.d_model
    positions = fetch.get(names.positions, (spec.max_seq_len, d)) \
        if spec.learned_positions and head else None
    # the layers' int8 weights are copies: the file's pages can go after each
    release = checkpoint.release_pages if numerics.copies_weights else None
    layers: list[LayerWeights | None] = []
    for i in range(spec.num_layers):
        layers.append(_layer(fetch, spec, i) if i in blocks else None)
        if release is not None:
            release()
    embed = lm_head = final_norm = None
    if head:
        embed, lm_head = numerics.embedding_and_head(fetch, spec)
        final_norm = fetch.norm(names.final_norm, spec)
    if release is not None:
        release()
    if store is not None:
        store.finish()
    return TransformerWeights(
        embed=embed, positions=positions, layers=layers,
        final_norm=final_norm, lm_head=lm_head, numerics=numerics.name,
    )
