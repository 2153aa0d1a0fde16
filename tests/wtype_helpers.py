"""Random GGUF weight rows of every integer type (random bytes, finite float16 scales), and
whether a weight is still the file's own bytes (`maps_the_file`), shared by the weight-type
tests."""

from __future__ import annotations

import mmap

import numpy as np

from needlepoint.kernels import wtypes

# byte offsets of each type's float16 scales (d, dmin, m) inside a block
HALF_AT = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
           "IQ4_NL": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
           "Q6_K": (208,)}
INTEGER_TYPES = tuple(HALF_AT)


def random_rows(name: str, rows: int, values: int, rng: np.random.Generator,
                halves: np.ndarray | None = None) -> np.ndarray:
    """uint8 [rows, row_bytes] of `values` values per row: random bytes, the float16 scales
    drawn from `halves` (default: magnitudes 1e-4 .. 0.1, either sign)."""
    wt = wtypes.weight_type(name)
    data = rng.integers(0, 256, (rows, wt.row_bytes(values)), dtype=np.uint8)
    blocks = data.reshape(-1, wt.block_bytes)
    for at in HALF_AT[name]:
        if halves is None:
            h = (rng.uniform(1e-4, 0.1, blocks.shape[0])
                 * rng.choice([-1, 1], blocks.shape[0])).astype(np.float16)
        else:
            h = rng.choice(np.asarray(halves, np.float16), blocks.shape[0])
        blocks[:, at : at + 2] = h.reshape(-1, 1).view(np.uint8)
    return data


def maps_the_file(array) -> bool:
    """Whether `array` is a view whose memory is a file mapping (no copy in between)."""
    while array is not None:
        if isinstance(array, mmap.mmap):
            return True
        array = getattr(array, "base", None)
    return False
