"""mHC lane routing around each block, batched over positions (fixture README step 5).

For block l with lane one-hot `e_l` (of the block's own, possibly ladder-renumbered, index):
  `nx = rms_unit(flatten X)` (A8 in deploy);
  `hpre = sigmoid(a_pre (phi_pre nx) + b_pre + 8 e_l - 4)`, `u = sum_i hpre_i X_i`;
  `hpost = 2 sigmoid(a_post (phi_post nx) + b_post - 4 (1 - e_l))`;
  `hres = Sinkhorn(a_res (phi_res nx as n x n) + b_res)`;
  `X_i <- sum_j hres_ij X_j + hpost_i y` with `y = B(u) - u`.
Sums are taken in upstream's order: `(a m + b) + offset`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import rms_unit, sinkhorn
from .weights import MhcWeights

if TYPE_CHECKING:  # pragma: no cover
    from .numerics import Numerics

F32 = np.float32


def route(lanes: np.ndarray, mhc: MhcWeights, num: Numerics):
    """Routing gates of one block for lanes [T, n, d]: (u [T, d], hpost [T, n], hres [T, n, n]),
    with the model's numerics (`numerics.py`)."""
    rows, n, width = lanes.shape
    normed = rms_unit(lanes.reshape(rows, n * width))
    mixed = num.product(normed, mhc.phi)  # [T, n + n + n*n]; deploy: the exact A8 product
    hpre = num.sigmoid(mhc.a_pre * mixed[:, :n] + mhc.b_pre + mhc.pre_offset)
    hpost = num.sigmoid(mhc.a_post * mixed[:, n : 2 * n] + mhc.b_post + mhc.post_offset)
    hpost *= F32(2.0)
    logits = mhc.a_res * mixed[:, 2 * n :].reshape(rows, n, n) + mhc.b_res
    return num.lane_sum(hpre, lanes), hpost, sinkhorn(logits)
