"""One transformer block on a chunk of positions, driven by the spec (no family branches).

    x = h + out_norm?(o(attention(rope?(qk_norm?(q)), rope?(qk_norm?(k)), v)))
                                                      with q, k, v from norm1(h)
    h = x + out_norm?(down(act(gate(norm2(x))) * up(norm2(x))))   gated (SwiGLU, GeGLU), or
    h = x + down(act(up(norm2(x))))                   plain (GPT-2: c_fc, gelu_new, c_proj)

The optional parts are spec fields (`qk_norm`: Qwen3, Gemma 3; `output_norms`: Gemma 3's
post-attention and post-feedforward norms; `attn_softcap`: the scores capped as
`cap * tanh(s / cap)` by the cache's attention). Every object here was built by the numerics
strategy at load (`numerics.py`: float or int8 norms, projections, activation, KV cache), so
the block is the same code for both; the KV cache of a sliding-window layer attends only its
window (`kv_cache.py`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .layers import rotate
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


def mlp(spec: BlockSpec, layer: LayerWeights, x: np.ndarray) -> np.ndarray:
    act = layer.act
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
    cache: Any,
    start: int,
    rope: tuple[np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """The residual stream h [T, d] (positions start..) after block `index`; appends this
    chunk's keys and values to `cache`. `rope`: this layer's cos, sin [T, head_dim]."""
    q, k, v = project_qkv(spec, layer, layer.norm1(h))
    if layer.q_norm is not None:
        q, k = layer.q_norm(q), layer.k_norm(k)
    if rope is not None:
        cos, sin = rope
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    scale = spec.attn_scale / (index + 1) if spec.scale_by_layer else spec.attn_scale
    if spec.attn_softcap is None:
        attended = layer.o(cache.attend(q, k, v, start, scale))
    else:
        attended = layer.o(cache.attend(q, k, v, start, scale, softcap=spec.attn_softcap))
    if layer.attn_out_norm is not None:
        attended = layer.attn_out_norm(attended)
    x = h + attended
    out = mlp(spec, layer, layer.norm2(x))
    if layer.mlp_out_norm is not None:
        out = layer.mlp_out_norm(out)
    out += x
    return out
