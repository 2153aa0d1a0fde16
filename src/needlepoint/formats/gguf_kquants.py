"""ggml's K-quants (super-blocks of 256 values) in numpy: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Written from the block layouts of ggml's `ggml-common.h` and the loops of its
`dequantize_row_q*_K` (issue 28 item 2: the quant types real Qwen / Gemma GGUFs use; Q4_K_M is
Q4_K with some Q6_K matrices). Each super-block decodes to integer codes, one scale per
sub-block and (Q2_K, Q4_K, Q5_K) one offset per sub-block, `value = scale * code + offset` in
float32, in the order ggml computes it (`scale = d * sc` first, then `scale * q`, then the
offset `-(dmin * m)`): so the values are ggml's bit for bit (tested against
`gguf.quants.dequantize` on random blocks).

Layouts (bytes per super-block; sub-block = values per scale):

* Q2_K, 84 B: `scales` u8[16], `qs` u8[64], `d`, `dmin`; sub-block 16; code 2 bits (0..3);
  scale `d * (sc & 15)`, offset `-dmin * (sc >> 4)`.
* Q3_K, 110 B: `hmask` u8[32], `qs` u8[64], `scales` 12 B (16 x 6 bits), `d`; sub-block 16;
  code 2 bits - (hmask bit ? 0 : 4) (-4..3); scale `d * (sc - 32)`.
* Q4_K, 144 B: `d`, `dmin`, `scales` 12 B (8 x a 6-bit sc and a 6-bit m), `qs` u8[128];
  sub-block 32; code 4 bits (0..15); scale `d * sc`, offset `-dmin * m`.
* Q5_K, 176 B: `d`, `dmin`, `scales` 12 B, `qh` u8[32], `qs` u8[128]; sub-block 32; code 4
  bits and a fifth (0..31); scale `d * sc`, offset `-dmin * m`.
* Q6_K, 210 B: `ql` u8[128], `qh` u8[64], `scales` int8[16], `d`; sub-block 16; code 4 + 2 bits
  - 32 (-32..31); scale `d * sc`.

(`d`, `dmin`: float16.) Value e of a super-block (0..255), as ggml's loops walk it:

* Q2_K / Q3_K: half n = e // 128, j = (e % 128) // 32, l = e % 32: the 2 bits at shift 2j of
  `qs[32n + l]`; Q3_K's high bit is bit 4n + j of `hmask[l]`;
* Q4_K / Q5_K: g = e // 64, h = (e % 64) // 32, l = e % 32: nibble h of `qs[32g + l]`; Q5_K's
  fifth bit is bit 2g + h of `qh[l]`;
* Q6_K: n = e // 128, k = (e % 128) // 32, l = e % 32: nibble k // 2 of `ql[64n + 32(k % 2) + l]`,
  high 2 bits at shift 2k of `qh[32n + l]`.

Q4_K and Q5_K have one scale and one offset per 32 values, the form of Q4_1 / Q5_1: the int8
numerics take them as stored (`sub_blocks_32`; `gguf_quants.integer_blocks`). Q2_K, Q3_K and
Q6_K scale every 16 values, which the kernels' one-scale-per-32 blocks cannot hold exactly;
they are dequantised to float32 here and quantised once at load like any float weight
(docs/hf.md, "Numerics (int8)").
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
QK_K = 256
SIZES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}

_E = np.arange(QK_K)


def _half(b: np.ndarray, at: int) -> np.ndarray:
    return b[:, at : at + 2].copy().view("<f2").astype(F32)  # [n, 1]


def _bits(data: np.ndarray, index: np.ndarray, shift: np.ndarray, mask: int) -> np.ndarray:
    """`(data[:, index] >> shift) & mask` per value, as int16 [n, 256]."""
    return ((data[:, index] >> shift.astype(np.uint8)) & np.uint8(mask)).astype(np.int16)


def _scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's `get_scale_min_k4` for j = 0..7: (sc, m), 6 bits each, int16 [n, 8]."""
    q = packed.astype(np.int16)
    sc = np.empty((q.shape[0], 8), np.int16)
    m = np.empty_like(sc)
    sc[:, :4], m[:, :4] = q[:, 0:4] & 63, q[:, 4:8] & 63
    sc[:, 4:] = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
    m[:, 4:] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return sc, m


def _q3_scales(packed: np.ndarray) -> np.ndarray:
    """Q3_K's 16 six-bit scales (ggml's kmask unpacking), minus 32, int16 [n, 16]."""
    q = packed.astype(np.int16)
    j = np.arange(16)
    low = np.where(j < 8, q[:, j % 8] & 0xF, q[:, j % 8] >> 4)
    high = (q[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


def _q2_k(b: np.ndarray):
    n, j, lane = _E // 128, (_E % 128) // 32, _E % 32
    codes = _bits(b[:, 16:80], 32 * n + lane, 2 * j, 3)
    sc = b[:, :16].astype(np.int16)
    return codes, _half(b, 80) * (sc & 0xF).astype(F32), -(_half(b, 82) * (sc >> 4).astype(F32))


def _q3_k(b: np.ndarray):
    n, j, lane = _E // 128, (_E % 128) // 32, _E % 32
    low = _bits(b[:, 32:96], 32 * n + lane, 2 * j, 3)
    high = _bits(b[:, :32], lane, 4 * n + j, 1)
    return low - 4 * (1 - high), _half(b, 108) * _q3_scales(b[:, 96:108]).astype(F32), None


def _q4_k(b: np.ndarray):
    g, h, lane = _E // 64, (_E % 64) // 32, _E % 32
    codes = _bits(b[:, 16:144], 32 * g + lane, 4 * h, 0xF)
    sc, m = _scale_min_k4(b[:, 4:16])
    return codes, _half(b, 0) * sc.astype(F32), -(_half(b, 2) * m.astype(F32))


def _q5_k(b: np.ndarray):
    g, h, lane = _E // 64, (_E % 64) // 32, _E % 32
    low = _bits(b[:, 48:176], 32 * g + lane, 4 * h, 0xF)
    fifth = _bits(b[:, 16:48], lane, 2 * g + h, 1)
    sc, m = _scale_min_k4(b[:, 4:16])
    return low | (fifth << 4), _half(b, 0) * sc.astype(F32), -(_half(b, 2) * m.astype(F32))


def _q6_k(b: np.ndarray):
    n, k, lane = _E // 128, (_E % 128) // 32, _E % 32
    low = _bits(b[:, :128], 64 * n + 32 * (k % 2) + lane, 4 * (k // 2), 0xF)
    high = _bits(b[:, 128:192], 32 * n + lane, 2 * k, 3)
    sc = b[:, 192:208].view(np.int8).astype(F32)
    return (low | (high << 4)) - 32, _half(b, 208) * sc, None


_DECODE = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def _super_blocks(raw: np.ndarray, type_name: str) -> np.ndarray:
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    size = SIZES[type_name]
    if data.size % size:
        raise ValueError(f"{data.size} bytes is not a whole number of {size}-byte "
                         f"{type_name} super-blocks")
    return data.reshape(-1, size)


def integer_form(raw: np.ndarray, type_name: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(codes int16 [n, 256], scale float32 [n, S], offset float32 [n, S] or None) of a K-quant
    payload of n super-blocks, S sub-blocks of 256 / S values each (module doc)."""
    return _DECODE[type_name](_super_blocks(raw, type_name))


def dequantize_k(raw: np.ndarray, type_name: str) -> np.ndarray:
    """float32 values [n * 256] of a K-quant payload, ggml's `dequantize_row_q*_K` bit for bit."""
    codes, scale, offset = integer_form(raw, type_name)
    width = QK_K // scale.shape[1]
    n = codes.shape[0]
    values = scale[:, :, None] * codes.reshape(n, -1, width).astype(F32)
    if offset is not None:
        values = values + offset[:, :, None]
    return values.reshape(-1)


def sub_blocks_32(raw: np.ndarray, type_name: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Q4_K / Q5_K as blocks of 32 (codes int8 [n * 256], scale and offset [n * 8]): the form
    `gguf_quants.integer_blocks` hands to the int8 numerics; None for the other K-quants."""
    if type_name not in ("Q4_K", "Q5_K"):
        return None
    codes, scale, offset = integer_form(raw, type_name)
    assert offset is not None
    return codes.astype(np.int8).reshape(-1), scale.reshape(-1), offset.reshape(-1)


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
