"""The Hadamard MLP (needle2 README "Forward pass" 3; seed 000 step 8).

`m = zcrms(x, pre_hada)` zero-padded to N, `z = Hn(d1 m)`, `z = Hn(silu(d2 z))`, output
`(d3 z)[:C]`, Hn the normalised Walsh-Hadamard transform in natural order. The transforms
are the vectorised butterflies of `kernels.fwht` (log2 N passes): at one token per step that
reads no weight matrix, where a dense N x N Hadamard matmul would stream 1 MB per layer.
"""

from __future__ import annotations

import numpy as np

from ...kernels.fwht import fwht
from ..ops import rms_unit, silu
from .weights import LayerWeights


def hadamard_mlp(x: np.ndarray, layer: LayerWeights) -> np.ndarray:
    """The MLP branch output for `x` [T, C] (before the residual add)."""
    count, width = x.shape
    padded = np.zeros((count, layer.d1.shape[0]), np.float32)
    np.multiply(layer.pre_hada * rms_unit(x), layer.d1[:width], out=padded[:, :width])
    z = fwht(padded)
    z = fwht(silu(layer.d2 * z))
    return layer.d3[:width] * z[:, :width]
