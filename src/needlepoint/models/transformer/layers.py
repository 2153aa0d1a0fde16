"""The elementwise parts of a block (no matrix products): norms, activations, RoPE.

All float32, as transformers computes them (`shared/fixtures/hf/README.md`, "Forward pass"):
RMSNorm multiplies the weight after normalising; LayerNorm uses the biased variance; gelu_tanh
is GPT-2's `gelu_new`; RoPE is the half-split ("rotate_half") layout with
`inv_freq[j] = 1 / theta^(2j/hd)` and angles `p * inv_freq` computed in float32.
"""

from __future__ import annotations

import numpy as np

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


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives -0, as it should
        return x / (F32(1.0) + np.exp(-x))


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


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def rope_angles(start: int, count: int, head_dim: int, theta: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [count, head_dim] for positions start..start+count-1 (halves repeated)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(F32) / F32(head_dim)
    inv_freq = F32(1.0) / (F32(theta) ** exponent)
    positions = np.arange(start, start + count, dtype=np.int64).astype(F32)
    angles = positions[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x [T, heads, hd] by the half-split rule: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = np.empty_like(x)
    np.negative(x[..., half:], out=rotated[..., :half])
    rotated[..., half:] = x[..., :half]
    rotated *= sin[:, None, :]
    out = x * cos[:, None, :]
    out += rotated
    return out
