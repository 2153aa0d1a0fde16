"""The transformer numerics as strategy objects, chosen once at load.

`TransformerFloat` (float32 weights and activations, BLAS products: the transformers
reference) and `TransformerInt8` (block-scaled int8 products, pinned norms, activations, RoPE
tables and int8 KV caches: the same bits for any chunking, batch, thread count or machine;
docs/hf.md "Numerics (int8)") own everything that differs between the two: how a norm, a
projection, a stored integer block, a joined projection, an activation, a RoPE table, a KV
cache, the embedding and the LM head are built, and whether a block runs as one native call.
The block (`block.py`), the forward (`runner.py`) and the weights (`weights.py`) only call
them: no operation takes a numerics flag. `numerics_named` maps the user's name
(`models/numerics.py`) to the strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...kernels.pinned import softcap32
from ..numerics import transformer_kind
from .attention import KVCache
from .int8 import ACTIVATIONS as INT8_ACTIVATIONS
from .int8 import BlockEmbedding, Int8KVCache, PinnedNorm, RopeTable
from .int8_fused import fused_blocks
from .layers import ACTIVATIONS, Norm, RopeAngles
from .linear import Int8Linear, Linear, fuse, make_int8_linear, make_linear
from .spec import BlockSpec

F32 = np.float32
Blocks = Callable[[], Any]  # a weight as the file stores it (`BlockWeight`), or None


def layer_cache(spec: BlockSpec, layer: int, storage: Callable[..., Any]) -> Any:
    """A layer's cache of the numerics' `storage` class, up to the longest sequence, kept as
    the layer's window says (`kv_cache.py`)."""
    return storage(spec.num_kv_heads, spec.head_dim, spec.max_seq_len, spec.window(layer))


class TransformerFloat:
    """Float32 numerics (`numerics="float"`)."""

    name = "float"
    exact = False  # BLAS picks kernels by shape: rows agree only to float rounding
    copies_weights = False  # float32 tensors stay views of the mapped file

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads

    def norm(self, weight: np.ndarray, bias: np.ndarray | None, eps: float,
             center: bool) -> Norm:
        return Norm(weight, bias, eps, center)

    def linear(self, fetch: Any, name: str, shape: tuple[int, int], bias: np.ndarray | None,
               prefixed: bool = True) -> Linear:
        """The projection of float tensor `name` (`shape` as stored) read through `fetch`
        (`weights._Fetcher`)."""
        return make_linear(fetch.get(name, shape, prefixed=prefixed), bias,
                           in_out=fetch.names.in_out)

    def stored(self, blocks: Blocks, bias: np.ndarray | None) -> None:
        return None  # the checkpoint's dequantised float32 weight is used

    def join(self, linears: Sequence[Linear]) -> None:
        return None  # one BLAS product per projection

    def activation(self, kind: str) -> Callable[[np.ndarray], np.ndarray]:
        return ACTIVATIONS[kind]

    def rope_table(self, head_dim: int, theta: float) -> RopeAngles:
        return RopeAngles(head_dim, theta)

    def kv_cache(self, spec: BlockSpec, layer: int) -> KVCache:
        return layer_cache(spec, layer, KVCache)

    def embedding_and_head(self, fetch: Any, spec: BlockSpec) -> tuple[Any, Linear]:
        names, d, vocab = fetch.names, spec.d_model, spec.vocab
        embed = fetch.get(names.embed, (vocab, d))
        head = embed if spec.tied_embeddings else fetch.get(names.lm_head, (vocab, d),
                                                            prefixed=False)
        return embed, make_linear(head, None, in_out=False)

    def fused_blocks(self, spec: BlockSpec, weights: Any) -> None:
        return None

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """`cap * tanh(x / cap)` in float32 (numpy's tanh)."""
        return np.tanh(np.divide(x, F32(cap), dtype=F32)) * F32(cap)


class TransformerInt8:
    """int8 numerics (`numerics="int8"` / `"deploy"`); `threads` split large products."""

    name = "int8"
    exact = True  # every row computed on its own: same bits for any chunking, split, batch
    copies_weights = True  # weights become packed codes: the file's pages can be released

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads

    def norm(self, weight: np.ndarray, bias: np.ndarray | None, eps: float,
             center: bool) -> PinnedNorm:
        return PinnedNorm(weight, bias, eps, center)

    def linear(self, fetch: Any, name: str, shape: tuple[int, int], bias: np.ndarray | None,
               prefixed: bool = True) -> Int8Linear:
        """The int8 projection of float tensor `name`: converted once (`fetch.converted`: from
        the int8 weight cache when one is open, `int8_cache.py`)."""
        n_out, k_in = shape[::-1] if fetch.names.in_out else shape

        def build() -> Any:
            weight = fetch.get(name, shape, prefixed=prefixed)
            return self._converted(weight, fetch.names.in_out)

        part = fetch.converted(fetch.full_name(name, prefixed), n_out, k_in, build)
        return Int8Linear([part], bias)

    def _converted(self, weight: np.ndarray, in_out: bool) -> Any:
        return make_int8_linear(weight, None, in_out=in_out, threads=self.threads).parts[0]

    def stored(self, blocks: Blocks, bias: np.ndarray | None) -> Int8Linear | None:
        """A weight the file stores in an integer ggml type, multiplied as stored (None:
        a float weight)."""
        found = blocks()
        return None if found is None else Int8Linear([found], bias)

    def join(self, linears: Sequence[Int8Linear]) -> Int8Linear:
        return fuse(linears)  # one activation quantisation for q | k | v, gate | up

    def activation(self, kind: str) -> Callable[[np.ndarray], np.ndarray]:
        return INT8_ACTIVATIONS[kind]

    def rope_table(self, head_dim: int, theta: float) -> RopeTable:
        return RopeTable(head_dim, theta)

    def kv_cache(self, spec: BlockSpec, layer: int) -> Int8KVCache:
        return layer_cache(spec, layer, Int8KVCache)

    def embedding_and_head(self, fetch: Any, spec: BlockSpec) -> tuple[Any, Int8Linear]:
        """An embedding the file stores in an integer type is read row by row from its own
        blocks (`BlockEmbedding`), and a tied LM head multiplies those same blocks: the float
        table is never built."""
        names, d, vocab = fetch.names, spec.d_model, spec.vocab
        stored = fetch.stored(names.embed, d, vocab)
        embed = None if stored is None else BlockEmbedding(stored)
        if spec.tied_embeddings:
            if stored is not None:
                return embed, Int8Linear([stored], None)
            table = fetch.get(names.embed, (vocab, d))
            head = fetch.converted(fetch.full_name(names.embed) + "@lm_head", vocab, d,
                                   lambda: self._converted(table, False))
            return table, Int8Linear([head], None)
        head = fetch.linear(names.lm_head, d, vocab, False, prefixed=False)
        return (fetch.get(names.embed, (vocab, d)) if embed is None else embed), head

    def fused_blocks(self, spec: BlockSpec, weights: Any) -> list | None:
        """Each block as one native call (`int8_fused.py`), or None."""
        return fused_blocks(spec, weights)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """`cap * tanh(x / cap)` pinned: `kernels.pinned.softcap32` (same bits everywhere)."""
        return softcap32(x, cap)


TransformerNumerics = TransformerFloat | TransformerInt8


def numerics_named(numerics: str, threads: int = 1) -> TransformerNumerics:
    """The strategy of a numerics name ("float", "int8" or "deploy")."""
    kind = transformer_kind(numerics)
    return TransformerFloat(threads) if kind == "float" else TransformerInt8(threads)


__all__ = ["TransformerFloat", "TransformerInt8", "TransformerNumerics", "numerics_named"]
