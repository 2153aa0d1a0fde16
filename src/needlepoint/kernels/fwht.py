"""Fast Walsh-Hadamard transform in natural (Sylvester) order.

`H[i, j] = (-1)^popcount(i & j)`; normalised by 1/sqrt(n) it is symmetric and its own
inverse (fixture README "CQ tensors"; seed 000 "FWHT"). Vectorised butterflies: log2(n)
passes over the whole array, no Python loop over elements.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def fwht(x: np.ndarray, normalize: bool = True) -> np.ndarray:
    """Walsh-Hadamard transform along the last axis (length a power of two), as float32.

    With `normalize` the result is scaled by 1/sqrt(n), so `fwht(fwht(x)) == x`; without it
    `fwht(fwht(x)) == n * x`.
    """
    data = np.asarray(x, dtype=np.float32)
    n = data.shape[-1]
    if not is_power_of_two(n):
        raise ValueError(f"FWHT length must be a power of two, got {n}")
    lead = data.shape[:-1]
    out = data.reshape(-1, n).copy()
    rows = out.shape[0]
    half = 1
    scratch = np.empty_like(out)
    while half < n:
        view = out.reshape(rows, n // (2 * half), 2, half)
        dest = scratch.reshape(rows, n // (2 * half), 2, half)
        np.add(view[:, :, 0], view[:, :, 1], out=dest[:, :, 0])
        np.subtract(view[:, :, 0], view[:, :, 1], out=dest[:, :, 1])
        out, scratch = scratch, out
        half *= 2
    if normalize:
        out *= np.float32(1.0 / np.sqrt(n))
    return out.reshape(*lead, n)


@lru_cache(maxsize=8)
def hadamard_matrix(n: int, normalize: bool = True) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix (read-only), optionally scaled by 1/sqrt(n)."""
    matrix = fwht(np.eye(n, dtype=np.float32), normalize=normalize)
    matrix.setflags(write=False)
    return matrix


def fwht_groups(x: np.ndarray, group: int) -> np.ndarray:
    """Normalised FWHT of each consecutive `group`-wide block of the last axis.

    The last axis is zero-padded to a multiple of `group` first, which is how CQ pads `in`.
    This is the activation side of a CQ matmul: `W x = C (H x)` per group, since H is
    symmetric and orthonormal.

    Sylvester matrices factor as `H_(a*b) = H_a (x) H_b` (Kronecker), so for groups of 64 and
    more each block, viewed row-major as an [a, b] matrix X, becomes `H_a X H_b`: two small
    products with ~5x fewer flops than one product with the [group, group] matrix (this runs
    on every CQ-matmul input of every prefill chunk and decode step).
    """
    data = np.asarray(x, dtype=np.float32)
    width = data.shape[-1]
    padded = -(-width // group) * group
    if padded != width:
        pad = [(0, 0)] * (data.ndim - 1) + [(0, padded - width)]
        data = np.pad(data, pad)
    lead = data.shape[:-1]
    if group < 64 or not is_power_of_two(group):
        return (data.reshape(-1, group) @ hadamard_matrix(group)).reshape(*lead, padded)
    inner = 1 << ((group.bit_length() - 1 + 1) // 2)  # 128 -> 16 x 8
    outer = group // inner
    rotated = data.reshape(-1, inner) @ hadamard_matrix(inner)  # H_b along the fast axis
    rotated = np.matmul(hadamard_matrix(outer), rotated.reshape(-1, outer, inner))  # H_a X
    return rotated.reshape(*lead, padded)
