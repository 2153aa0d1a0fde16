"""Small pure functions shared by the Needle 2 and Needle 3 models (float32 throughout).

Each follows the fixture READMEs' "Forward pass" sections; names say what they compute.
"""

from __future__ import annotations

import numpy as np

from ..kernels import native, pinned

F32 = np.float32
ONE = F32(1.0)
# the RMS norms' epsilon, inside the square root (fixture README step 5): the one constant
RMS_EPS = F32(1e-6)
ENGRAM_SEED_MULT = 0x9E3779B9
ENGRAM_FNV_PRIME = 0x01000193


def rms_denominator(x: np.ndarray) -> np.ndarray:
    """`sqrt(mean(x^2) + 1e-6)` over the last axis (keepdims, float32): numpy's float32 mean
    (the float32 sum, then a true divide by the count, as `np.mean` does), without `np.mean`'s
    Python-level overhead."""
    square = np.square(x)
    out = np.add.reduce(square, axis=-1, keepdims=True)
    np.true_divide(out, np.intp(x.shape[-1]), out=out, casting="unsafe")
    out += RMS_EPS
    return np.sqrt(out, out=out)


def rms_unit(x: np.ndarray) -> np.ndarray:
    """`x * rsqrt(mean(x^2) + 1e-6)` over the last axis, in upstream's operation order
    (`_rms_unit`: the reciprocal of the root, then a product; Needle 2 and Needle 3). Deploy
    numerics quantise what follows, so each float32 rounding here matters (docs/numerics.md)."""
    x = np.asarray(x, F32)
    inverse = rms_denominator(x)
    np.divide(ONE, inverse, out=inverse)
    return x * inverse


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`1 / (1 + exp(-x))` in float32 with numpy's exp (float numerics; deploy numerics use
    `kernels.pinned.sigmoid`): negate, exp, add 1, divide 1 by it, in place on a fresh array
    (or on `out`, which may be x)."""
    out = np.negative(x, out=np.empty(np.shape(x), F32) if out is None else out)
    np.exp(out, out=out)
    out += ONE
    np.divide(ONE, out, out=out)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """`x * sigmoid(x)`, the one float SiLU (Needle 2, transformer float numerics)."""
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives -0
        return x * sigmoid(x)


def softmax(x: np.ndarray, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    """`exp(x - max x) / sum(exp(x - max x))` over `axis` (float numerics' softmax; deploy
    numerics': `needle3.exact_ops.softmax_rows`), in place on `out` (which may be x)."""
    out = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= np.add.reduce(out, axis=axis, keepdims=True)
    return out


def _log_domain_sinkhorn(logits: np.ndarray, rounds: int) -> np.ndarray:
    """Upstream's loop (fixture README step 5): `rounds` of subtracting the row, then the
    column, log-sum-exp, then exp; float32. `sinkhorn`'s fallback for a matrix whose scaling
    under- or overflows."""
    z = np.asarray(logits, F32)
    for _ in range(rounds):
        for axis in (-1, -2):
            peak = np.max(z, axis=axis, keepdims=True)
            z = z - (peak + np.log(np.sum(np.exp(z - peak), axis=axis, keepdims=True)))
    return np.exp(z)


def sinkhorn(logits: np.ndarray, rounds: int = 20) -> np.ndarray:
    """mHC's doubly-stochastic `hres` of every matrix of logits [T, n, n] (fixture README
    step 5: `rounds` of subtracting the row then the column log-sum-exp, then exp): the one
    Sinkhorn of Needle 2 and Needle 3 in either numerics, by the native
    kernel when the library is loaded (`np_sinkhorn`), else `sinkhorn_reference`: the same
    bits."""
    return native.dispatch(None, sinkhorn_reference, _sinkhorn_native, logits, rounds)


def _sinkhorn_native(lib, logits: np.ndarray, rounds: int) -> np.ndarray:
    z = np.ascontiguousarray(logits, F32)
    out = np.empty_like(z)
    if lib.np_sinkhorn(z.ctypes.data, z.shape[0], z.shape[1], rounds, out.ctypes.data) == 0:
        return out
    return sinkhorn_reference(logits, rounds)  # its log-domain form where a scaling overflows


def sinkhorn_reference(logits: np.ndarray, rounds: int = 20) -> np.ndarray:
    """`sinkhorn` in numpy. Subtracting log-sum-exps is dividing by sums, so this computes
    upstream's matrix in the scaling form: `K = exp(z - max z)` in float64 with the pinned
    exponential (`kernels.pinned.exp64`: the same bits on every machine), then
    `r = 1 / (K c)`, `c = 1 / (K^T r)` alternated `rounds` times, `diag(r) K diag(c)` cast to
    float32, each length-n sum taken in index order (as `np_sinkhorn` adds). A matrix whose
    scaling under- or overflows (a logit spread past ~700; never in practice) takes upstream's
    log-domain loop instead."""
    rows, n, _ = logits.shape
    peak = logits.reshape(rows, n * n).max(axis=1)
    # [i, j, T]: positions innermost, so every product and sum runs over long vectors
    shifted = np.ascontiguousarray(logits.transpose(1, 2, 0)) - peak  # float32
    kernel = pinned.exp64(shifted.astype(np.float64))
    row = col = np.ones(kernel.shape[1:], np.float64)  # [i, T], [j, T]
    scratch = np.empty_like(kernel)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for _ in range(rounds):
            # r_i = 1 / sum_j K_ij c_j, then c_j = 1 / sum_i K_ij r_i (each summed in order)
            row = np.add.reduce(np.multiply(kernel, col[None], out=scratch), axis=1)
            np.divide(1.0, row, out=row)
            col = np.add.reduce(np.multiply(kernel, row[:, None], out=scratch), axis=0)
            np.divide(1.0, col, out=col)
        out = row[:, None] * kernel
        out *= col[None]
    bad = ~np.isfinite(out).all(axis=(0, 1))
    result = np.ascontiguousarray(out.transpose(2, 0, 1), dtype=F32)
    if bad.any():
        result[bad] = _log_domain_sinkhorn(logits[bad], rounds)
    return result


def fake_quant_a8(x: np.ndarray) -> np.ndarray:
    """Symmetric per-row int8 fake quantisation over the whole last axis (README "Deploy
    quantization"): `s = max|x| / 127` (1 if all zero),
    `clip(round_half_even(x/s), -128, 127) * s`."""
    x = np.asarray(x, np.float32)
    peak = np.max(np.abs(x), axis=-1, keepdims=True)
    step = np.where(peak > 0, peak / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    return np.clip(np.rint(x / step), -128, 127).astype(np.float32) * step


def quantize_int8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same quantiser as `fake_quant_a8`, kept as int8 codes plus a float32 step per row
    (for an int8 KV cache): `codes * step == fake_quant_a8(x)` exactly."""
    x = np.asarray(x, np.float32)
    peak = np.max(np.abs(x), axis=-1, keepdims=True)
    step = np.where(peak > 0, peak / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    codes = np.clip(np.rint(x / step), -128, 127).astype(np.int8)
    return codes, step


def rope_tables(
    positions: np.ndarray, head_dim: int, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [len(positions), head_dim/2] for rotate-half RoPE, `freq_i = theta^(-2i/hd)`."""
    half = head_dim // 2
    exponent = np.arange(half, dtype=np.float32) * np.float32(2.0 / head_dim)
    inv_freq = np.float32(1.0) / np.power(np.float32(theta), exponent, dtype=np.float32)
    angles = np.asarray(positions, np.float32)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rope_tables_pinned(
    positions: np.ndarray, head_dim: int, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """`rope_tables` computed in float64 and rounded once to float32 (deploy numerics,
    docs/numerics.md): the float64 power/cos/sin of any libm are within an ulp of each other,
    so the float32 tables agree across machines (numpy's float32 cos/sin take SIMD paths
    that differ by CPU)."""
    half = head_dim // 2
    exponent = np.arange(half, dtype=np.float64) * (2.0 / head_dim)
    inv_freq = 1.0 / np.power(np.float64(np.float32(theta)), exponent)
    angles = np.asarray(positions, np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on the last axis: `[x1 cos - x2 sin, x2 cos + x1 sin]`.

    `cos`/`sin` broadcast against x[..., :half] (e.g. [T, 1, half] for x [T, heads, hd]).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate((x1 * cos - x2 * sin, x2 * cos + x1 * sin), axis=-1)


def engram_slots(
    tokens: np.ndarray, order: int, seed_index: int, slots: int
) -> np.ndarray:
    """Hashed engram slot per position for one (order, head) table (README "Forward pass" 2).

    `seed = 0x9E3779B9 * seed_index mod 2^32`; for j < order:
    `acc = (acc ^ tok[t-j]) * 0x01000193 mod 2^32` (tokens before the start are 0);
    `acc ^= acc >> 15`; slot = acc mod slots. Vectorised over positions in uint64.
    """
    ids = np.asarray(tokens, np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    acc = np.full(ids.shape, (ENGRAM_SEED_MULT * seed_index) & 0xFFFFFFFF, np.uint64)
    for back in range(order):
        shifted = np.zeros_like(ids)
        if back == 0:
            shifted[:] = ids
        elif back < len(ids):
            shifted[back:] = ids[:-back]
        acc = ((acc ^ shifted) * np.uint64(ENGRAM_FNV_PRIME)) & mask
    acc ^= acc >> np.uint64(15)
    return (acc % np.uint64(slots)).astype(np.int64)
