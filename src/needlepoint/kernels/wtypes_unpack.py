"""GGUF weight blocks, as stored, to the generic unpacked form of the integer product (numpy).

Every integer weight type becomes, per block of 32 values along the input axis: int8
`codes[32]`, int16 sub-scales `s[2]` (values 0-15 and 16-31), float32 `a`, float32 `m` and
int16 min sub-scales `u[2]`; the block's weight value i (half h = i // 16) is
`a * s_h * code_i + m * u_h`. `kernels/native/np_wt.h` unpacks the same blocks to the same
numbers in C; `kernels.wtypes` is the table that names each type's unpacker.

Layouts (ggml's `ggml-common.h`; `d`, `dmin`, `m` float16, little-endian):

| type | bytes / values | layout | code, s, a, m, u |
|---|---|---|---|
| Q8_0 | 34 / 32 | d, qs int8[32] | q, 1, d, 0, 0 |
| Q4_0 | 18 / 32 | d, qs u8[16] | q - 8, 1, d, 0, 0 |
| Q4_1 | 20 / 32 | d, m, qs u8[16] | q, 1, d, m, 1 |
| Q5_0 | 22 / 32 | d, qh u32, qs u8[16] | q5 - 16, 1, d, 0, 0 |
| Q5_1 | 24 / 32 | d, m, qh u32, qs u8[16] | q5, 1, d, m, 1 |
| IQ4_NL | 18 / 32 | d, qs u8[16] | kvalues[q], 1, d, 0, 0 |
| Q2_K | 84 / 256 | scales u8[16], qs u8[64], d, dmin | q, sc & 15, d, -dmin, sc >> 4 |
| Q3_K | 110 / 256 | hmask u8[32], qs u8[64], scales 12 B, d | q - 4 (hmask bit 0), sc6 - 32, d |
| Q4_K | 144 / 256 | d, dmin, scales 12 B, qs u8[128] | q, sc_j, d, -dmin, mn_j |
| Q5_K | 176 / 256 | d, dmin, scales 12 B, qh u8[32], qs u8[128] | q5, sc_j, d, -dmin, mn_j |
| Q6_K | 210 / 256 | ql u8[128], qh u8[64], scales int8[16], d | q6 - 32, sc, d, 0, 0 |

For the 4-bit 32-value types byte j of `qs` holds value j (low nibble) and j + 16 (high);
bit j of `qh` is value j's fifth bit. K-quant value e of a super-block: Q2_K / Q3_K: n = e //
128, j = (e % 128) // 32, l = e % 32, bits 2j of qs[32n + l], Q3_K's high bit 4n + j of
hmask[l]; Q4_K / Q5_K: g = e // 64, h = (e % 64) // 32, nibble h of qs[32g + l], Q5_K's fifth
bit 2g + h of qh[l]; Q6_K: n = e // 128, k = (e % 128) // 32, nibble k // 2 of
ql[64n + 32(k % 2) + l], 2 bits at 2k of qh[32n + l]; 16-value sub-block scales for Q2_K,
Q3_K, Q6_K (two per block of 32), 32-value ones (6 bits, ggml's `get_scale_min_k4`) for
Q4_K / Q5_K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32 = np.float32
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                          113], np.int8)


@dataclass(frozen=True)
class Unpacked:
    """The generic form of R rows of nb blocks: codes int8 [R, nb, 32], s int16 [R, nb, 2],
    a float32 [R, nb], m float32 [R, nb], u int16 [R, nb, 2]."""

    codes: np.ndarray
    s: np.ndarray
    a: np.ndarray
    m: np.ndarray
    u: np.ndarray


def _half(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at : at + 2]).view("<f2").astype(F32)[:, 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _fifth(qh: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(qh).view("<u4")  # [n, 1]
    return (((bits >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _form(codes, s, a, m=None, u=None) -> tuple:
    """Blocks [n, ...] of one type as (codes [n', 32], s [n', 2], a, m, u), n' = 32-blocks."""
    codes = np.asarray(codes, np.int16).reshape(-1, 32).astype(np.int8)
    n = codes.shape[0]
    s = np.broadcast_to(np.asarray(s, np.int16).reshape(-1, 2) if np.ndim(s) else s, (n, 2))
    a = np.broadcast_to(np.asarray(a, F32).reshape(-1, 1), (n, 1))[:, 0]
    m = np.zeros(n, F32) if m is None else np.broadcast_to(np.asarray(m, F32).reshape(-1, 1),
                                                           (n, 1))[:, 0]
    u = np.zeros((n, 2), np.int16) if u is None else np.broadcast_to(
        np.asarray(u, np.int16).reshape(-1, 2) if np.ndim(u) else u, (n, 2))
    return codes, np.asarray(s, np.int16), a, m, np.asarray(u, np.int16)


def _repeat8(values: np.ndarray) -> np.ndarray:
    """A per-super-block value [n] as one per 32-block [n * 8]."""
    return np.repeat(values, 8)


def q8_0(b: np.ndarray) -> tuple:
    return _form(b[:, 2:].view(np.int8), 1, _half(b, 0))


def q4_0(b: np.ndarray) -> tuple:
    return _form(_nibbles(b[:, 2:]).astype(np.int16) - 8, 1, _half(b, 0))


def q4_1(b: np.ndarray) -> tuple:
    return _form(_nibbles(b[:, 4:]), 1, _half(b, 0), _half(b, 2), 1)


def q5_0(b: np.ndarray) -> tuple:
    q = _nibbles(b[:, 6:]) | _fifth(b[:, 2:6])
    return _form(q.astype(np.int16) - 16, 1, _half(b, 0))


def q5_1(b: np.ndarray) -> tuple:
    return _form(_nibbles(b[:, 8:]) | _fifth(b[:, 4:8]), 1, _half(b, 0), _half(b, 2), 1)


def iq4_nl(b: np.ndarray) -> tuple:
    return _form(KVALUES_IQ4NL[_nibbles(b[:, 2:])], 1, _half(b, 0))


_E = np.arange(256)


def _bits(data: np.ndarray, index: np.ndarray, shift: np.ndarray, mask: int) -> np.ndarray:
    return ((data[:, index] >> shift.astype(np.uint8)) & np.uint8(mask)).astype(np.int16)


def scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's `get_scale_min_k4` for j = 0..7: (sc, mn), 6 bits each, int16 [n, 8]."""
    q = packed.astype(np.int16)
    sc = np.empty((q.shape[0], 8), np.int16)
    mn = np.empty_like(sc)
    sc[:, :4], mn[:, :4] = q[:, 0:4] & 63, q[:, 4:8] & 63
    sc[:, 4:] = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return sc, mn


def q3_scales(packed: np.ndarray) -> np.ndarray:
    """Q3_K's 16 six-bit scales minus 32, int16 [n, 16]."""
    q = packed.astype(np.int16)
    j = np.arange(16)
    low = np.where(j < 8, q[:, j % 8] & 0xF, q[:, j % 8] >> 4)
    high = (q[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


def q2_k(b: np.ndarray) -> tuple:
    n, j, lane = _E // 128, (_E % 128) // 32, _E % 32
    codes = _bits(b[:, 16:80], 32 * n + lane, 2 * j, 3)
    sc = b[:, :16].astype(np.int16)
    return _form(codes, sc & 0xF, _repeat8(_half(b, 80)), _repeat8(-_half(b, 82)), sc >> 4)


def q3_k(b: np.ndarray) -> tuple:
    n, j, lane = _E // 128, (_E % 128) // 32, _E % 32
    low = _bits(b[:, 32:96], 32 * n + lane, 2 * j, 3)
    high = _bits(b[:, :32], lane, 4 * n + j, 1)
    return _form(low - 4 * (1 - high), q3_scales(b[:, 96:108]), _repeat8(_half(b, 108)))


def _k4_form(codes: np.ndarray, b: np.ndarray) -> tuple:
    sc, mn = scale_min_k4(b[:, 4:16])
    pair = lambda v: np.repeat(v.reshape(-1, 1), 2, axis=1)  # noqa: E731
    return _form(codes, pair(sc), _repeat8(_half(b, 0)), _repeat8(-_half(b, 2)), pair(mn))


def q4_k(b: np.ndarray) -> tuple:
    g, h, lane = _E // 64, (_E % 64) // 32, _E % 32
    return _k4_form(_bits(b[:, 16:144], 32 * g + lane, 4 * h, 0xF), b)


def q5_k(b: np.ndarray) -> tuple:
    g, h, lane = _E // 64, (_E % 64) // 32, _E % 32
    low = _bits(b[:, 48:176], 32 * g + lane, 4 * h, 0xF)
    fifth = _bits(b[:, 16:48], lane, 2 * g + h, 1)
    return _k4_form(low | (fifth << 4), b)


def q6_k(b: np.ndarray) -> tuple:
    n, k, lane = _E // 128, (_E % 128) // 32, _E % 32
    low = _bits(b[:, :128], 64 * n + 32 * (k % 2) + lane, 4 * (k // 2), 0xF)
    high = _bits(b[:, 128:192], 32 * n + lane, 2 * k, 3)
    sc = b[:, 192:208].view(np.int8).astype(np.int16)
    return _form((low | (high << 4)) - 32, sc, _repeat8(_half(b, 208)))


def unpack_rows(decode, data: np.ndarray, block_bytes: int) -> Unpacked:
    """`decode` (one of the functions above) over uint8 rows [R, row_bytes]: the generic form
    of every block of every row."""
    data = np.asarray(data)
    rows = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(-1, block_bytes)
    codes, s, a, m, u = decode(blocks)
    nb = codes.shape[0] // rows if rows else 0
    return Unpacked(codes.reshape(rows, nb, 32), s.reshape(rows, nb, 2), a.reshape(rows, nb),
                    m.reshape(rows, nb), u.reshape(rows, nb, 2))


def dequantize_form(form: Unpacked, offset: bool) -> np.ndarray:
    """float32 [R, nb * 32] of the generic form, in ggml's order: `(a * s) * code`, then
    `+ m * u` for the types with an offset (bit for bit ggml's `dequantize_row_*`)."""
    rows, nb = form.a.shape
    step = np.repeat(form.a[:, :, None] * form.s.astype(F32), 16, axis=2)  # [R, nb, 32]
    values = step * form.codes.astype(F32)
    if offset:
        values = values + np.repeat(form.m[:, :, None] * form.u.astype(F32), 16, axis=2)
    return values.reshape(rows, nb * 32)
