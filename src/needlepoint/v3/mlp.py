"""Hadamard (Monarch) MLP, batched over positions (fixture README "Forward pass", step 5).

`N = hada_n`, `ba = 2^(bitlen(N-1)//2)`, `bb = N/ba`:
`cond = 1 + softmax(x cond_v) cond_u`; `z = pad(x, N)`;
`z = K1(d1*z)[p1]`; `z = K2(silu(d2*cond*z + b2))[p2]`; `z = K3(d3*z)`; out `(d4*z)[:d]`,
where `Ks(z)` views z as a [ba, bb] row-major matrix Z and returns `flatten(wsa^T Z wsb)`.
"""

from __future__ import annotations

import numpy as np

from ..ops import silu, softmax
from .weights import MlpWeights

F32 = np.float32


def monarch(z: np.ndarray, wsa: np.ndarray, wsb: np.ndarray) -> np.ndarray:
    """`flatten(wsa^T Z wsb)` for every row of z [T, ba*bb], as two batched BLAS products."""
    rows = z.shape[0]
    ba, bb = wsa.shape[0], wsb.shape[0]
    right = z.reshape(rows * ba, bb) @ wsb  # Z wsb, [T*ba, bb]
    # (wsa^T Y)^T = Y^T wsa: one product over all positions instead of T small ones.
    left = right.reshape(rows, ba, bb).transpose(0, 2, 1).reshape(rows * bb, ba) @ wsa
    return left.reshape(rows, bb, ba).transpose(0, 2, 1).reshape(rows, ba * bb)


def hadamard_mlp(
    x: np.ndarray, weights: MlpWeights, perm1: np.ndarray, perm2: np.ndarray, hada_n: int
) -> np.ndarray:
    """HadamardMLP(x) for x [T, d] -> [T, d]."""
    rows, width = x.shape
    cond = F32(1.0) + softmax(x @ weights.cond_v, axis=-1) @ weights.cond_u
    z = np.zeros((rows, hada_n), F32)
    z[:, :width] = x
    (w1a, w1b), (w2a, w2b), (w3a, w3b) = weights.stages
    z = monarch(weights.d1 * z, w1a, w1b)[:, perm1]
    z = monarch(silu(weights.d2 * cond * z + weights.b2), w2a, w2b)[:, perm2]
    z = monarch(weights.d3 * z, w3a, w3b)
    return (weights.d4 * z)[:, :width]
