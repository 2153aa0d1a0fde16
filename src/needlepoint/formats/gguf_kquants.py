"""K-quant encoders (Q4_K, Q6_K) for the test and benchmark GGUFs: the `gguf` package writes
the other types but has no K-quant encoder. Decoding every type, K-quants included, is the
weight-type table's (`kernels.wtypes`: ggml's layouts, bit for bit with `gguf.quants`).
"""

from __future__ import annotations

import numpy as np

QK_K = 256
SIZES = {"Q4_K": 144, "Q6_K": 210}  # bytes per super-block of the types written here


# ---------------------------------------------------------------------- encoders (Q4_K, Q6_K)
def _f16(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float32).astype(np.float16)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """Q4_K super-blocks (uint8 [n, 144]) of float32 values [n * 256]: per 32-value sub-block
    the range [min(0, x), max x] in 15 steps, its scale and minimum quantised to 6 bits against
    the super-block's float16 `d` / `dmin` (ggml's layout; the plain rounding, without
    llama.cpp's iterative search, so a weight is within about a step of its value). For the
    test and benchmark GGUFs: the `gguf` package has no K-quant encoder."""
    x = np.asarray(values, np.float32).reshape(-1, 8, 32)
    low = np.minimum(x.min(axis=-1), 0.0)
    scale = (x.max(axis=-1) - low) / 15
    d = _f16(scale.max(axis=-1) / 63)
    dmin = _f16(-low.min(axis=-1) / 63)
    dd, dm = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, dd, out=np.zeros_like(scale), where=dd > 0)), 0, 63)
    m = np.clip(np.rint(np.divide(-low, dm, out=np.zeros_like(low), where=dm > 0)), 0, 63)
    step, offset = (dd * sc)[..., None], (dm * m)[..., None]
    q = np.clip(np.rint(np.divide(x + offset, step, out=np.zeros_like(x), where=step > 0)),
                0, 15).astype(np.uint8)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    packed = np.empty((len(x), 12), np.uint8)
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    pairs = q.reshape(-1, 4, 2, 32)  # value 64 g + 32 h + l: nibble h of qs[32 g + l]
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8),
                           packed, qs], axis=1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks (uint8 [n, 210]) of float32 values [n * 256]: per 16-value sub-block
    a signed scale (int8 against the float16 `d`), codes -32..31 (ggml's layout, plain
    rounding; see `quantize_q4_k`)."""
    x = np.asarray(values, np.float32).reshape(-1, 16, 16)
    scale = np.abs(x).max(axis=-1) / 31
    d = _f16(scale.max(axis=-1) / 127)
    dd = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, dd, out=np.zeros_like(scale), where=dd > 0)), 0, 127)
    step = (dd * sc)[..., None]
    q = (np.clip(np.rint(np.divide(x, step, out=np.zeros_like(x), where=step > 0)), -32, 31)
         + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [n, half, k, l]
    low, high = q & 0xF, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4),
                         low[:, :, 1] | (low[:, :, 3] << 4)], axis=2).reshape(-1, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4)
          | (high[:, :, 3] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8),
                           d.reshape(-1, 1).view(np.uint8)], axis=1)
