"""GGUF tensor payloads to float32: the ggml block layouts, in numpy.

Our own decoders (the layouts of ggml's `ggml-common.h`; every block covers 32 consecutive
values of a row, `d`/`m` are float16, and for the 4-bit types byte j of `qs` holds value j in
its low nibble and value j+16 in its high nibble):

| type | bytes | block | value |
|---|---|---|---|
| F32 / F16 / BF16 | 4 / 2 / 2 | 1 | as stored (BF16: the upper half of a float32) |
| Q8_0 | 34 | `d`, `qs` int8[32] | `d * q` |
| Q4_0 | 18 | `d`, `qs` u8[16] | `d * (q - 8)` |
| Q4_1 | 20 | `d`, `m`, `qs` u8[16] | `d * q + m` |
| Q5_0 | 22 | `d`, `qh` u32, `qs` u8[16] | `d * ((q | h << 4) - 16)` |
| Q5_1 | 24 | `d`, `m`, `qh` u32, `qs` u8[16] | `d * (q | h << 4) + m` |

(bit j of `qh` is the fifth bit of value j.) The K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K are
decoded by `gguf_kquants` (their layouts are in its docstring). Any other ggml type (IQ types,
TQ, ...) goes through the `gguf` package's own numpy decoders (`gguf.quants.dequantize`); a type
it cannot decode either is an `UnsupportedTensorTypeError` naming the tensor.

`integer_blocks` gives the same five block types as integers instead (the int8 numerics run
them as stored): codes, one float32 scale per block and an optional offset, with
`value = scale * code + offset` per block of 32 (Q8_0: `d * q`; Q4_0: `d * q - 8 d`; Q4_1:
`d * q + m`; Q5_0: `d * q5 - 16 d`; Q5_1: `d * q5 + m`), and Q4_K / Q5_K, whose 32-value
sub-blocks have the same form (`d * sc * q - dmin * m`, `gguf_kquants.sub_blocks_32`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import UnsupportedTensorTypeError
from .gguf_kquants import SIZES as K_SIZES
from .gguf_kquants import dequantize_k, sub_blocks_32

F32 = np.float32
QK = 32


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if data.size % block_bytes:
        raise ValueError(f"{data.size} bytes is not a whole number of {block_bytes}-byte blocks")
    return data.reshape(-1, block_bytes)


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view("<f2").astype(F32)  # [n, 1]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """u8[n, 16] -> values [n, 32]: low nibbles (values 0..15), then high (16..31)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(F32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    bits = qh.copy().view("<u4")  # [n, 1]
    return ((bits >> np.arange(QK, dtype=np.uint32)) & 1).astype(F32) * F32(16)


def q8_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 34)
    return _half(b, 0) * b[:, 2:].view(np.int8).astype(F32)


def q4_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 18)
    return _half(b, 0) * (_nibbles(b[:, 2:]) - F32(8))


def q4_1(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 20)
    return _half(b, 0) * _nibbles(b[:, 4:]) + _half(b, 2)


def q5_0(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 22)
    return _half(b, 0) * (_nibbles(b[:, 6:]) + _fifth_bits(b[:, 2:6]) - F32(16))


def q5_1(raw: np.ndarray) -> np.ndarray:
    b = _blocks(raw, 24)
    return _half(b, 0) * (_nibbles(b[:, 8:]) + _fifth_bits(b[:, 4:8])) + _half(b, 2)


def _integer_q8_0(b: np.ndarray):
    return b[:, 2:].view(np.int8), _half(b, 0), None


def _integer_q4(b: np.ndarray, zero: bool):
    qs = b[:, 4 if zero else 2 :]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8)
    d = _half(b, 0)
    return codes, d, _half(b, 2) if zero else d * F32(-8)


def _integer_q5(b: np.ndarray, zero: bool):
    head = 4 if zero else 2
    bits = b[:, head : head + 4].copy().view("<u4")
    fifth = ((bits >> np.arange(QK, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    qs = b[:, head + 4 :]
    codes = (np.concatenate([qs & 0x0F, qs >> 4], axis=1) | fifth).astype(np.int8)
    d = _half(b, 0)
    return codes, d, _half(b, 2) if zero else d * F32(-16)


_INTEGER = {"Q8_0": (34, _integer_q8_0), "Q4_0": (18, lambda b: _integer_q4(b, False)),
            "Q4_1": (20, lambda b: _integer_q4(b, True)),
            "Q5_0": (22, lambda b: _integer_q5(b, False)),
            "Q5_1": (24, lambda b: _integer_q5(b, True))}


def integer_blocks(raw: np.ndarray, type_name: str, rows: int, cols: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(codes int8 [rows, cols], scale float32 [rows, cols / 32], offset or None) of a
    Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K payload (module doc); None for any other
    type (Q2_K, Q3_K, Q6_K: scales per 16 values)."""
    entry = _INTEGER.get(type_name)
    if cols % QK or (entry is None and type_name not in K_SIZES):
        return None
    if entry is None:
        found = sub_blocks_32(raw, type_name) if cols % 256 == 0 else None
        if found is None:
            return None
        codes, scale, offset = found
    else:
        size, decode = entry
        codes, scale, offset = decode(_blocks(raw, size))
    nb = cols // QK
    shaped = lambda a: np.ascontiguousarray(a.reshape(rows, nb))  # noqa: E731
    return (np.ascontiguousarray(codes.reshape(rows, cols)), shaped(scale),
            None if offset is None else shaped(offset))


def _plain(kind: str) -> Callable[[np.ndarray], np.ndarray]:
    def decode(raw: np.ndarray) -> np.ndarray:
        data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        if kind == "BF16":
            return (data.view("<u2").astype(np.uint32) << np.uint32(16)).view(F32)
        return data.view({"F32": "<f4", "F16": "<f2"}[kind]).astype(F32, copy=False)

    return decode


DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": _plain("F32"), "F16": _plain("F16"), "BF16": _plain("BF16"),
    "Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1,
    **{name: (lambda raw, name=name: dequantize_k(raw, name)) for name in K_SIZES},
}


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The float32 tensor `shape` (numpy order: rows last-but-one) of a tensor's raw payload."""
    decode = DECODERS.get(type_name)
    try:
        if decode is not None:
            values = decode(raw)
        else:
            values = _gguf_dequantize(raw, type_name, name)
        return np.asarray(values, F32).reshape(shape)
    except ValueError as error:
        raise UnsupportedTensorTypeError(
            f"GGUF tensor {name!r} ({type_name}): payload does not decode to {list(shape)}: "
            f"{error}") from None


def _gguf_dequantize(raw: np.ndarray, type_name: str, name: str) -> np.ndarray:
    try:
        import gguf
        from gguf.quants import dequantize as gguf_dequantize

        qtype = gguf.GGMLQuantizationType[type_name]
        return gguf_dequantize(np.ascontiguousarray(raw).view(np.uint8), qtype)
    except (KeyError, NotImplementedError, ImportError, AttributeError) as error:
        raise UnsupportedTensorTypeError(
            f"GGUF tensor {name!r}: type {type_name} cannot be decoded "
            f"(needlepoint decodes {', '.join(DECODERS)} and what gguf.quants supports): "
            f"{error!r}") from None
