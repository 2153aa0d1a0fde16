"""Pinned-order float kernels (docs/numerics.md "Pinned float operations").

Where a result is a float sum that cannot be made exact, its order is fixed instead: the same
sequence of IEEE operations for a row whatever the number of rows, the chunking or the
machine. Each function here has a numpy reference (`*_reference`, vectorised across rows and
columns but never across the summed axis) and runs the native kernel when it is built; the two
give the same bits (tests/kernels/test_pinned.py).

* `matmul_seq(x, w)`: `out[t, n] = (((0 + x[t,0] w[0,n]) + x[t,1] w[1,n]) + ...)` in float32.
* `exp32(x)`: exp of float32 values through one fixed float64 polynomial, rounded once.
* `attend(...)`: int8 attention of query rows over their keys in position order.
* `dequant_rows(rotated)`: `R @ H / sqrt(128)` per CQ group in the fused multiply-add order of
  the reference the fixtures were made with (numpy on OpenBLAS: a row of one group as gemv,
  blocks of 8; a row of several groups as gemm, one chain).
"""

from __future__ import annotations

import numpy as np

from . import native

F32, F64 = np.float32, np.float64
GROUP = 128

# exp64: x = k ln2 + r, |r| <= ln2 / 2 (Cody-Waite, fdlibm's split of ln 2), degree-11 Taylor
LOG2E = 1.4426950408889634
LN2_HI = 0.6931471803691238
LN2_LO = 1.9082149292705877e-10
TAYLOR = (
    2.505210838544172e-08, 2.755731922398589e-07, 2.7557319223985893e-06,
    2.48015873015873e-05, 0.0001984126984126984, 0.001388888888888889,
    0.008333333333333333, 0.041666666666666664, 0.16666666666666666, 0.5, 1.0, 1.0,
)


def exp64_reference(x: np.ndarray) -> np.ndarray:
    """The float64 exp polynomial of `np_exp64` (C), operation for operation."""
    x = np.asarray(x, F64)
    nan = np.isnan(x)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        x = np.where(np.isfinite(x), x, np.where(x > 0, 1000.0, -1000.0))
        k = np.rint(x * LOG2E)
        r = x - k * LN2_HI
        r = r - k * LN2_LO
        p = np.full_like(r, TAYLOR[0])
        for coefficient in TAYLOR[1:]:
            p = p * r + coefficient
        out = np.ldexp(p, np.clip(k, -2000, 2000).astype(np.int32))
    out = np.where(x < -745.0, 0.0, out)
    out = np.where(x > 709.0, np.inf, out)
    return np.where(nan, np.nan, out)


def exp32_reference(x: np.ndarray) -> np.ndarray:
    """exp of float32 values as float32: `float32(exp64(float64(x)))` (module doc)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return exp64_reference(np.asarray(x, F32).astype(F64)).astype(F32)


def exp32(x: np.ndarray, use_native: bool | None = None) -> np.ndarray:
    """`exp32_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, exp32_reference, _exp32_native, x)


def exp64(x: np.ndarray, use_native: bool | None = None) -> np.ndarray:
    """`exp64_reference` of float64 values, by the native kernel when it is built."""
    return native.dispatch(use_native, exp64_reference, _exp64_native, x)


def _exp_array(entry, x: np.ndarray, dtype: type) -> np.ndarray:
    """The native exp `entry` (`np_exp32_array`, `np_exp64_array`) of x as `dtype`."""
    x = np.ascontiguousarray(x, dtype)
    out = np.empty_like(x)
    entry(x.ctypes.data, x.size, out.ctypes.data)
    return out


def _exp32_native(lib, x: np.ndarray) -> np.ndarray:
    return _exp_array(lib.np_exp32_array, x, F32)


def _exp64_native(lib, x: np.ndarray) -> np.ndarray:
    return _exp_array(lib.np_exp64_array, x, F64)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """`1 / (1 + exp32(-x))` in float32 (pinned exp)."""
    out = exp32(np.negative(x, dtype=F32))
    out += F32(1.0)
    return np.divide(F32(1.0), out, out=out)


def softcap32(x: np.ndarray, cap: float, use_native: bool | None = None) -> np.ndarray:
    """Logit soft-capping `cap * tanh(x / cap)` in float32 with the pinned exp (same bits on
    every machine, native exp or not): y = x / cap, t = exp32(-2|y|),
    tanh y = sign(y) (1 - t) / (1 + t)."""
    x = np.asarray(x, F32)
    c = F32(cap)
    y = np.divide(x, c, dtype=F32)
    t = exp32(np.multiply(np.abs(y), F32(-2.0), dtype=F32), use_native)
    th = np.divide(F32(1.0) - t, F32(1.0) + t, dtype=F32)
    return np.multiply(np.copysign(th, y), c, dtype=F32)


def matmul_seq_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`x [T, K] @ w [K, N]` summed over k in order, each product and sum rounded."""
    x = np.asarray(x, F32)
    w = np.asarray(w, F32)
    out = np.zeros((x.shape[0], w.shape[1]), F32)
    for k in range(x.shape[1]):
        out += x[:, k : k + 1] * w[k]
    return out


def matmul_seq(x: np.ndarray, w: np.ndarray, use_native: bool | None = None) -> np.ndarray:
    """`matmul_seq_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, matmul_seq_reference, _matmul_seq_native, x, w)


def _matmul_seq_native(lib, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, F32)
    w = np.ascontiguousarray(w, F32)
    rows, depth = x.shape
    out = np.empty((rows, w.shape[1]), F32)
    lib.np_matmul_seq(x.ctypes.data, rows, depth, depth, w.ctypes.data, w.shape[1],
                      out.ctypes.data)
    return out


# -- int8 attention ---------------------------------------------------------------------------
def attend_reference(
    qcode: np.ndarray, qscale: np.ndarray, kcode: np.ndarray, kscale: np.ndarray,
    vcode: np.ndarray, vscale: np.ndarray, slots: np.ndarray, count: np.ndarray,
    softcap: float | None = None,
) -> np.ndarray:
    """Query rows qcode [Q, qk] (scales [Q]) over the key/value slots `slots[i, :count[i]]`
    of kcode [S, qk] / vcode [S, vd] int8 (scales [S]) -> [Q, vd] float32, as `np_attend`;
    queries and keys both int8, or both int16 (A16 codes, within +-32767):
    score_j = float32(((dot_j * sq) * sk_j) / sqrt(qk)); softmax with the pinned exp and a
    float32 sum in slot-list order; out = sum_j p_j * (vcode_j * sv_j) in that order. With
    `softcap` the scores are `softcap32(score, softcap)` before the softmax (no native form:
    the models that need it run this reference)."""
    rows, qk = qcode.shape
    vd = vcode.shape[1]
    inv = 1.0 / np.sqrt(float(qk))
    longest = int(count.max(initial=0))
    if longest == 0:
        return np.zeros((rows, vd), F32)
    index = np.where(np.arange(longest)[None, :] < count[:, None], slots[:, :longest], 0)
    keys = kcode[index].astype(np.int64)  # [Q, n, qk]
    dots = np.einsum("qe,qne->qn", qcode.astype(np.int64), keys)  # exact integers
    scores = dots.astype(F64) * qscale.astype(F64)[:, None]
    scores = scores * kscale[index].astype(F64)
    scores = (scores * inv).astype(F32)
    if softcap is not None:
        scores = softcap32(scores, softcap)
    valid = np.arange(longest)[None, :] < count[:, None]
    scores = np.where(valid, scores, F32(-np.inf))
    peak = scores.max(axis=1, keepdims=True)
    weights = np.where(valid, exp32_reference(scores - peak), F32(0.0))
    total = np.zeros(rows, F32)
    for j in range(longest):
        total = np.where(valid[:, j], total + weights[:, j], total)
    out = np.zeros((rows, vd), F32)
    values = vcode[index].astype(F32) * vscale[index][:, :, None]  # [Q, n, vd], float32
    for j in range(longest):
        p = weights[:, j] / total
        step = out + p[:, None] * values[:, j]
        out = np.where(valid[:, j, None], step, out)
    return out


def attend(
    qcode: np.ndarray, qscale: np.ndarray, kcode: np.ndarray, kscale: np.ndarray,
    vcode: np.ndarray, vscale: np.ndarray, slots: np.ndarray, count: np.ndarray,
    use_native: bool | None = None,
) -> np.ndarray:
    """`attend_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, attend_reference, _attend_native, qcode, qscale, kcode,
                           kscale, vcode, vscale, slots, count)


def _attend_native(lib, qcode: np.ndarray, qscale: np.ndarray, kcode: np.ndarray,
                   kscale: np.ndarray, vcode: np.ndarray, vscale: np.ndarray, slots: np.ndarray,
                   count: np.ndarray) -> np.ndarray:
    rows, qk = qcode.shape
    vd = vcode.shape[1]
    key16 = kcode.dtype == np.int16
    if (qcode.dtype == np.int16) != key16:
        raise TypeError("attend takes int8 queries with int8 keys, int16 with int16")
    width = np.int16 if key16 else np.int8
    qcode = np.ascontiguousarray(qcode, width)
    qscale = np.ascontiguousarray(qscale, F32)
    slots = np.ascontiguousarray(slots, np.int64)
    count = np.ascontiguousarray(count, np.int64)
    out = np.empty((rows, vd), F32)
    work = np.empty(max(1, slots.shape[1]), F32)
    kcode = np.ascontiguousarray(kcode, width)
    lib.np_attend(
        qcode.ctypes.data, qscale.ctypes.data, rows, qk, kcode.ctypes.data, int(key16),
        kscale.ctypes.data,
        vcode.ctypes.data, vscale.ctypes.data, vd, slots.ctypes.data, count.ctypes.data,
        slots.shape[1], 1.0 / np.sqrt(float(qk)), out.ctypes.data, work.ctypes.data,
    )
    return out


# -- dequantisation in the fixtures' order ------------------------------------------------
def hadamard_signs() -> np.ndarray:
    """[128, 128] float32 of +-1: (-1)^popcount(k & j)."""
    k = np.arange(GROUP)[:, None] & np.arange(GROUP)[None, :]
    parity = np.zeros_like(k)
    for bit in range(7):
        parity ^= (k >> bit) & 1
    return np.where(parity == 1, F32(-1.0), F32(1.0))


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add, exactly: the product of two float32 is exact in float64;
    the float64 sum is rounded to odd (TwoSum error, then the last bit forced odd when the sum
    was inexact) so the final rounding to float32 is the single correct rounding."""
    product = a.astype(F64) * b.astype(F64)
    c64 = c.astype(F64)
    total = product + c64
    virtual = total - product
    error = (product - (total - virtual)) + (c64 - virtual)
    bits = total.view(np.int64)
    inexact = error != 0
    even = (bits & 1) == 0
    # toward the error's side is the odd neighbour when the rounded sum is even
    nudge = inexact & even
    direction = np.where((error > 0) == (total > 0), 1, -1)
    bits = np.where(nudge & (total != 0), bits + direction, bits)
    return bits.view(F64).astype(F32)


def dequant_rows_reference(rotated: np.ndarray, h: float) -> np.ndarray:
    """rotated [rows, groups, 128] float32 -> [rows, groups * 128] (module doc order)."""
    rows, groups, _ = rotated.shape
    hmat = hadamard_signs() * F32(h)
    if groups == 1:
        acc = np.zeros((rows, groups, GROUP), F32)
        for block in range(0, GROUP, 8):
            part = np.zeros_like(acc)
            for k in range(block, block + 8):
                part = _fma32(rotated[:, :, k : k + 1], hmat[k], part)
            acc = acc + part
    else:
        acc = np.zeros((rows, groups, GROUP), F32)
        for k in range(GROUP):
            acc = _fma32(rotated[:, :, k : k + 1], hmat[k], acc)
    return acc.reshape(rows, groups * GROUP)


def dequant_rows(rotated: np.ndarray, h: float, use_native: bool | None = None) -> np.ndarray:
    """`dequant_rows_reference`, by the native kernel when it is built (same bits)."""
    return native.dispatch(use_native, dequant_rows_reference, _dequant_rows_native, rotated, h)


def _dequant_rows_native(lib, rotated: np.ndarray, h: float) -> np.ndarray:
    rotated = np.ascontiguousarray(rotated, F32)
    rows, groups, _ = rotated.shape
    out = np.empty((rows, groups * GROUP), F32)
    lib.np_dequant_rows(rotated.ctypes.data, rows, groups, F32(h), out.ctypes.data)
    return out


# -- the Hadamard MLP in one call ---------------------------------------------------------
def hadamard_mlp_native(
    x: np.ndarray, vectors: tuple, factors: tuple, cond_v: np.ndarray, cond_u: np.ndarray,
    perm1: np.ndarray, perm2: np.ndarray, hada_n: int, keep: list,
) -> np.ndarray | None:
    """`models.needle3.mlp.hadamard_mlp_pinned` in one native call (`np_hadamard_mlp`,
    the same operations), or None when the native kernels are not built or the geometry is
    not the one it takes (conditioning rank 8). `vectors` = d1, d2, b2, d3, d4 and
    `factors` = w1a, w1b, w2a, w2b, w3a, w3b, all float32 C-contiguous; `keep` holds the
    pointer tables between calls (one list per weight set)."""
    lib = native.library()
    if lib is None or cond_v.shape[1] != 8:
        return None
    if not keep:
        import ctypes  # noqa: PLC0415

        arrays = [np.ascontiguousarray(a, F32) for a in (*vectors, *factors, cond_v, cond_u)]
        arrays += [np.ascontiguousarray(p, np.int64) for p in (perm1, perm2)]
        vec = (ctypes.c_void_p * 5)(*[a.ctypes.data for a in arrays[:5]])
        mats = (ctypes.c_void_p * 6)(*[a.ctypes.data for a in arrays[5:11]])
        keep.extend([arrays, vec, mats])
    arrays, vec, mats = keep
    x = np.ascontiguousarray(x, F32)
    rows, width = x.shape
    ba = factors[0].shape[0]
    out = np.empty((rows, width), F32)
    status = lib.np_hadamard_mlp(
        x.ctypes.data, rows, width, hada_n, ba, hada_n // ba, vec, mats, arrays[11].ctypes.data,
        arrays[12].ctypes.data, 8, arrays[13].ctypes.data, arrays[14].ctypes.data,
        out.ctypes.data,
    )
    return out if status == 0 else None
