"""One transformer block on a chunk of positions, driven by the spec (no family branches).

    x = h + o(attention(rope?(q), rope?(k), v))       with q, k, v from norm1(h)
    h = x + down(act(gate(norm2(x))) * up(norm2(x)))  gated (SwiGLU), or
    h = x + down(act(up(norm2(x))))                   plain (GPT-2: c_fc, gelu_new, c_proj)

Every matrix product is a `Linear` call; norms, RoPE, softmax and the activation are the
elementwise parts in `layers.py` / `attention.py` (float) or `int8.py` (`numerics="int8"`: the
activation from `int8.ACTIVATIONS`, the cache an `Int8KVCache`; same code path otherwise).
"""

from __future__ import annotations

import numpy as np

from .attention import KVCache
from .int8 import ACTIVATIONS as INT8_ACTIVATIONS
from .int8 import Int8KVCache
from .layers import ACTIVATIONS, apply_rope
from .spec import BlockSpec
from .weights import LayerWeights


def project_qkv(spec: BlockSpec, layer: LayerWeights, x: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [T, H, hd], k and v [T, Hkv, hd] of the normed input x [T, d]."""
    count = x.shape[0]
    if layer.qkv is not None:
        fused = layer.qkv(x)
        q = fused[:, : spec.q_dim]
        k = fused[:, spec.q_dim : spec.q_dim + spec.kv_dim]
        v = fused[:, spec.q_dim + spec.kv_dim :]
    else:
        q, k, v = layer.q(x), layer.k(x), layer.v(x)
    return (q.reshape(count, spec.num_heads, spec.head_dim),
            k.reshape(count, spec.num_kv_heads, spec.head_dim),
            v.reshape(count, spec.num_kv_heads, spec.head_dim))


def mlp(spec: BlockSpec, layer: LayerWeights, x: np.ndarray, int8: bool = False) -> np.ndarray:
    act = (INT8_ACTIVATIONS if int8 else ACTIVATIONS)[spec.activation]
    if layer.gate_up is not None:
        both = layer.gate_up(x)
        hidden = act(both[:, : spec.d_ff])
        hidden *= both[:, spec.d_ff :]
    elif spec.gated:
        hidden = act(layer.gate(x))
        hidden *= layer.up(x)
    else:
        hidden = act(layer.up(x))
    return layer.down(hidden)


def block_forward(
    spec: BlockSpec,
    layer: LayerWeights,
    index: int,
    h: np.ndarray,
    cache: KVCache | Int8KVCache,
    start: int,
    rope: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """The residual stream h [T, d] (positions start..) after block `index`; appends this
    chunk's keys and values to `cache`."""
    q, k, v = project_qkv(spec, layer, layer.norm1(h))
    if rope is not None:
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scale = spec.attn_scale / (index + 1) if spec.scale_by_layer else spec.attn_scale
    attended = cache.attend(q, k, v, start, scale)
    x = h + layer.o(attended)
    out = mlp(spec, layer, layer.norm2(x), isinstance(cache, Int8KVCache))
    out += x
    return out
