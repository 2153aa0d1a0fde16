"""Manifold hyper-connections (mHC): the lane router around every block.

needle2 README "Forward pass" 3 (and seed 000 steps 6 and 9): from the lanes entering layer
i, `nx = rms_unit(flattened lanes)`; `hpre`, `hpost` and `hres` are three maps of that one
normalised vector, so they are computed by one fused matmul per layer.
"""

from __future__ import annotations

import numpy as np

from ..ops import rms_unit, sigmoid, sinkhorn
from .weights import MhcWeights

SINKHORN_ROUNDS = 20


def route(lanes: np.ndarray, mhc: MhcWeights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(hpre [T, n], hpost [T, n], hres [T, n, n])` from the lanes `[T, n, C]`.

    hpre = sigmoid(a_pre phi_pre nx + b_pre + 8 onehot - 4);
    hpost = 2 sigmoid(a_post phi_post nx + b_post - 4 (1 - onehot));
    hres = sinkhorn(a_res reshape(phi_res nx, n, n) + b_res), row = destination lane.
    """
    count, n, width = lanes.shape
    mixed = rms_unit(lanes.reshape(count, n * width)) @ mhc.phi
    hpre = sigmoid(mhc.a_pre * mixed[:, :n] + mhc.bias_pre)
    hpost = np.float32(2.0) * sigmoid(mhc.a_post * mixed[:, n : 2 * n] + mhc.bias_post)
    res_logits = mhc.a_res * mixed[:, 2 * n :].reshape(count, n, n) + mhc.b_res
    return hpre, hpost, sinkhorn(res_logits, SINKHORN_ROUNDS)


def lane_sum(weights: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """`u = sum_j hpre[j] lane[j]`: [T, n] x [T, n, C] -> [T, C]."""
    return np.matmul(weights[:, None, :], lanes)[:, 0]


def update_lanes(
    lanes: np.ndarray, hres: np.ndarray, hpost: np.ndarray, update: np.ndarray
) -> np.ndarray:
    """`lane'[r] = sum_j hres[r, j] lane[j] + hpost[r] y` for every position."""
    out = np.matmul(hres, lanes)
    out += hpost[:, :, None] * update[:, None, :]
    return out
