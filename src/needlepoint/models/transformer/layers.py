"""The float numerics' elementwise parts of a block (no matrix products): norms, activations,
RoPE tables (SiLU and RoPE are the shared `models/ops.py` functions).

All float32, as transformers computes them (`shared/fixtures/hf/README.md`, "Forward pass"):
RMSNorm multiplies the weight after normalising; LayerNorm uses the biased variance; gelu_tanh
is GPT-2's `gelu_new`; RoPE is the half-split ("rotate_half") layout with
`inv_freq[j] = 1 / theta^(2j/hd)` and angles `p * inv_freq` computed in float32.
"""

from __future__ import annotations

import numpy as np

from .. import ops

F32 = np.float32
_SQRT_2_OVER_PI = F32(np.sqrt(2.0 / np.pi))
_GELU_C = F32(0.044715)


class Norm:
    """RMSNorm (`bias` None) or LayerNorm over the last axis; chosen by the spec at load."""

    __slots__ = ("weight", "bias", "eps", "center")

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, eps: float,
                 center: bool) -> None:
        self.weight = np.asarray(weight, F32)
        self.bias = None if bias is None else np.asarray(bias, F32)
        self.eps = F32(eps)
        self.center = center

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.center:
            x = x - np.mean(x, axis=-1, keepdims=True, dtype=F32)
        scale = np.mean(np.square(x), axis=-1, keepdims=True, dtype=F32)
        scale += self.eps
        y = x / np.sqrt(scale)
        y *= self.weight
        if self.bias is not None:
            y += self.bias
        return y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    inner = x * x
    inner *= _GELU_C * x
    inner += x
    inner *= _SQRT_2_OVER_PI
    y = np.tanh(inner)
    y += F32(1.0)
    y *= x
    y *= F32(0.5)
    return y


ACTIVATIONS = {"silu": ops.silu, "gelu_tanh": gelu_tanh}


class RopeAngles:
    """cos, sin [count, head_dim] (halves repeated) of one theta, float32 as transformers
    computes them (`ops.rope_tables`)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim, self.theta = head_dim, theta

    def __call__(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        positions = np.arange(start, start + count, dtype=np.int64)
        cos, sin = ops.rope_tables(positions, self.head_dim, self.theta)
        return np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, hd] rotated by full-width tables cos, sin [T, hd] (`ops.apply_rope`, the
    half-split rule)."""
    half = x.shape[-1] // 2
    return ops.apply_rope(x, cos[:, None, :half], sin[:, None, :half])
