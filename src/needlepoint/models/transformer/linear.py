"""Every matrix product of the transformer goes through `Linear` (the one swap point).

`Linear(weight, bias)` holds a float32 weight in `[in, out]` orientation (a transposed view of
an `[out, in]` torch weight costs nothing, and keeps a memory-mapped tensor mapped) and applies
`y = x W (+ b)` over the last axis of `x`. `make_linear` is how `weights.py` builds every
projection, the LM head included; an int8 product (block-scaled quantised activations, exact
integer accumulation) is a second class with the same `__call__`, chosen there.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


class Linear:
    """`y = x @ weight (+ bias)`: weight [in, out] float32, bias [out] or None."""

    __slots__ = ("weight", "bias")

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
        self.weight = weight
        self.bias = bias

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = np.matmul(x, self.weight)
        if self.bias is not None:
            y += self.bias
        return y

    def __repr__(self) -> str:
        bias = ", bias" if self.bias is not None else ""
        return f"Linear({self.in_features} -> {self.out_features}{bias})"


def make_linear(weight: np.ndarray, bias: np.ndarray | None, *, in_out: bool) -> Linear:
    """A projection from a checkpoint weight stored `[in, out]` (`in_out`) or `[out, in]`."""
    w = np.asarray(weight, F32)
    return Linear(w if in_out else w.T, None if bias is None else np.asarray(bias, F32))
