"""Hadamard (Monarch) MLP, batched over positions (fixture README "Forward pass", step 5).

`N = hada_n`, `ba = 2^(bitlen(N-1)//2)`, `bb = N/ba`:
`cond = 1 + softmax(x cond_v) cond_u`; `z = pad(x, N)`;
`z = K1(d1*z)[p1]`; `z = K2(silu(d2*cond*z + b2))[p2]`; `z = K3(d3*z)`; out `(d4*z)[:d]`,
where `Ks(z)` views z as a [ba, bb] row-major matrix Z and returns `flatten(wsa^T Z wsb)`.

`hadamard_mlp` is float numerics' form: `Ks` is two stacked matmuls over positions (`Z wsb`,
then `wsa^T Y`): numpy hands each position's 32 x 32 product to BLAS in place, which is
faster than one tall GEMM plus the transposing copy it needs, and is bit-for-bit the decode
step's `wsa.T @ (Z @ wsb)`. `hadamard_mlp_pinned` is deploy numerics' (every product and exp
in pinned order, `exact_ops`); `numerics.py` picks one per model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...kernels.pinned import hadamard_mlp_native
from ...kernels.pinned import sigmoid as pinned_sigmoid
from ..ops import sigmoid, softmax
from . import exact_ops
from .weights import MlpWeights

F32 = np.float32


def monarch(z: np.ndarray, wsa: np.ndarray, wsb: np.ndarray) -> np.ndarray:
    """`flatten(wsa^T Z wsb)` for every row of z [T, ba*bb]."""
    rows = z.shape[0]
    ba, bb = wsa.shape[0], wsb.shape[0]
    right = np.matmul(z.reshape(rows, ba, bb), wsb)  # Z wsb per position
    return np.matmul(wsa.T, right).reshape(rows, ba * bb)


def hadamard_mlp(
    x: np.ndarray, weights: MlpWeights, perm1: np.ndarray, perm2: np.ndarray, hada_n: int
) -> np.ndarray:
    """HadamardMLP(x) for x [T, d] -> [T, d] (float numerics: BLAS products, numpy's exp)."""
    logits = x @ weights.cond_v
    cond = softmax(logits, out=logits) @ weights.cond_u
    return _body(x, cond, weights, perm1, perm2, hada_n, monarch, sigmoid)


def hadamard_mlp_pinned(
    x: np.ndarray, weights: MlpWeights, perm1: np.ndarray, perm2: np.ndarray, hada_n: int,
    native: bool = True,
) -> np.ndarray:
    """HadamardMLP(x) in deploy numerics: every product and exp in pinned order, so a row's
    result does not depend on the batch; one native call when the kernels are built
    (`kernels.pinned.hadamard_mlp_native`, the same operations; `native=False` forces this
    numpy form)."""
    (w1a, w1b), (w2a, w2b), (w3a, w3b) = weights.stages
    if native:
        out = hadamard_mlp_native(
            x, (weights.d1, weights.d2, weights.b2, weights.d3, weights.d4),
            (w1a, w1b, w2a, w2b, w3a, w3b), weights.cond_v, weights.cond_u, perm1, perm2,
            hada_n, weights.native_tables,
        )
        if out is not None:
            return out
    cond = exact_ops.small_product(
        exact_ops.softmax_rows(exact_ops.small_product(x, weights.cond_v)), weights.cond_u
    )
    return _body(x, cond, weights, perm1, perm2, hada_n, exact_ops.monarch, pinned_sigmoid)


def _body(x: np.ndarray, cond: np.ndarray, weights: MlpWeights, perm1: np.ndarray,
          perm2: np.ndarray, hada_n: int, mix: Callable, act_of: Callable) -> np.ndarray:
    """Everything after `softmax(x cond_v) cond_u`, with the numerics' Monarch product and
    sigmoid."""
    rows, width = x.shape
    (w1a, w1b), (w2a, w2b), (w3a, w3b) = weights.stages
    cond += F32(1.0)
    z = np.zeros((rows, hada_n), F32)  # d1 * pad(x): the padding stays zero
    np.multiply(weights.d1[:width], x, out=z[:, :width])
    z = np.take(mix(z, w1a, w1b), perm1, axis=1)  # take: ~5x faster than z[:, perm]
    # silu(d2 * cond * z + b2), in upstream's order
    act = weights.d2 * cond
    act *= z
    act += weights.b2
    act *= act_of(act)
    z = np.take(mix(act, w2a, w2b), perm2, axis=1)
    z *= weights.d3
    out = mix(z, w3a, w3b)[:, :width]
    return out * weights.d4[:width]
