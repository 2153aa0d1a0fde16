"""The weight types: one record per GGUF storage type (ggml's `type_traits`), the one place
that says how a type's blocks are laid out, unpacked and dequantised.

An integer type's `unpack(rows u8 [R, row_bytes]) -> wtypes_unpack.Unpacked` gives the generic
form both the numpy reference and the C kernels compute (`kernels/wtypes_unpack.py` holds the
layouts; `kernels/native/np_wt.h` the C unpack of each, selected by `native_id`); the
product over that form is `kernels.blockweight`. `dequantize(rows) -> float32 [R, values]` is
ggml's dequantisation bit for bit (tested against `gguf.quants`). The float types (F32, F16,
BF16) have `unpack=None`: in int8 numerics a 2-D float weight is turned once into Q8_0 blocks
by `to_q8_0`.

Adding a type: its entry in `TYPES` (ggml id, block geometry, a new `native_id`), its numpy
unpacker in `wtypes_unpack.py`, its C unpack in `np_wt.h`, and tests in
`tests/kernels/test_wtypes.py` (docs/architecture.md, "Where does a change go").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedTensorTypeError
from . import wtypes_unpack as wu

F32 = np.float32


@dataclass(frozen=True)
class WeightType:
    """One storage type: `block_values` values in `block_bytes` bytes along a row.
    `native_id` is the C kernels' type number (0: not an integer type)."""

    name: str
    ggml_id: int
    block_values: int
    block_bytes: int
    native_id: int
    unpack: Callable[[np.ndarray], wu.Unpacked] | None
    dequantize: Callable[[np.ndarray], np.ndarray]

    def row_bytes(self, values: int) -> int:
        """Bytes of a row of `values` values (a whole number of blocks)."""
        if values % self.block_values:
            raise UnsupportedTensorTypeError(
                f"{self.name} rows hold whole blocks of {self.block_values} values, "
                f"not {values}")
        return values // self.block_values * self.block_bytes


def _rows(data: np.ndarray) -> np.ndarray:
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 2:
        raise ValueError(f"weight rows must be uint8 [rows, bytes], got {data.dtype} "
                         f"{list(data.shape)}")
    return data


def _integer(name: str, ggml_id: int, values: int, size: int, native_id: int, decode,
             offset: bool) -> WeightType:
    def unpack(data: np.ndarray) -> wu.Unpacked:
        return wu.unpack_rows(decode, _rows(data), size)

    def dequantize(data: np.ndarray) -> np.ndarray:
        return wu.dequantize_form(unpack(data), offset)

    return WeightType(name, ggml_id, values, size, native_id, unpack, dequantize)


def _float(name: str, ggml_id: int, size: int) -> WeightType:
    def dequantize(data: np.ndarray) -> np.ndarray:
        rows = _rows(data)
        flat = np.ascontiguousarray(rows)
        if name == "BF16":
            out = (flat.view("<u2").astype(np.uint32) << np.uint32(16)).view(F32)
        else:
            out = flat.view({"F32": "<f4", "F16": "<f2"}[name]).astype(F32)
        return out.reshape(rows.shape[0], -1)

    return WeightType(name, ggml_id, 1, size, 0, None, dequantize)


_TABLE = [
    # name, ggml id, values, bytes, native id, unpacker, has an offset (m * u)
    ("Q8_0", 8, 32, 34, 1, wu.q8_0, False),
    ("Q4_0", 2, 32, 18, 2, wu.q4_0, False),
    ("Q4_1", 3, 32, 20, 3, wu.q4_1, True),
    ("Q5_0", 6, 32, 22, 4, wu.q5_0, False),
    ("Q5_1", 7, 32, 24, 5, wu.q5_1, True),
    ("IQ4_NL", 20, 32, 18, 6, wu.iq4_nl, False),
    ("Q2_K", 10, 256, 84, 7, wu.q2_k, True),
    ("Q3_K", 11, 256, 110, 8, wu.q3_k, False),
    ("Q4_K", 12, 256, 144, 9, wu.q4_k, True),
    ("Q5_K", 13, 256, 176, 10, wu.q5_k, True),
    ("Q6_K", 14, 256, 210, 11, wu.q6_k, False),
]

TYPES: dict[str, WeightType] = {
    **{row[0]: _integer(*row) for row in _TABLE},
    "F32": _float("F32", 0, 4), "F16": _float("F16", 1, 2), "BF16": _float("BF16", 30, 2),
}
# the types whose blocks carry an offset (m * u): the others' m and u are all zero
OFFSET_TYPES = frozenset(row[0] for row in _TABLE if row[6])


def weight_type(name: str) -> WeightType:
    """The record of storage type `name` (a GGUF type name such as "Q4_K")."""
    found = TYPES.get(name)
    if found is None:
        raise UnsupportedTensorTypeError(
            f"weight type {name} has no integer product or decoder here "
            f"(known: {', '.join(TYPES)})")
    return found


def to_q8_0(w: np.ndarray) -> np.ndarray:
    """Q8_0 blocks (uint8 [n, k_pad / 32 * 34]) of a float weight [n, k] (rows are outputs,
    zero-padded to a multiple of 32): per block `d = float16(max|w| / 127)`, codes
    `rint(w / d)` clipped to +-127 (a block with d = 0 gets codes 0)."""
    w = np.asarray(w, F32)
    if w.ndim != 2:
        raise ValueError(f"to_q8_0 takes a 2-D weight, got shape {list(w.shape)}")
    n, k = w.shape
    k_pad = -(-k // 32) * 32
    full = np.zeros((n, k_pad), F32)
    full[:, :k] = w
    blocks = full.reshape(n, k_pad // 32, 32)
    if not np.all(np.isfinite(blocks)):
        raise ValueError("to_q8_0: the weight has non-finite values")
    with np.errstate(over="ignore"):
        d = (np.max(np.abs(blocks), axis=-1) / F32(127.0)).astype(np.float16)
    if not np.all(np.isfinite(d)):
        raise ValueError("to_q8_0: a block's scale is beyond float16 (|w| > 8.3e6)")
    dd = d.astype(F32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(dd > 0, np.clip(np.rint(blocks / dd), -127, 127), 0).astype(np.int8)
    out = np.empty((n, k_pad // 32, 34), np.uint8)
    out[:, :, :2] = d[..., None].view(np.uint8)
    out[:, :, 2:] = codes.view(np.uint8)
    return out.reshape(n, k_pad // 32 * 34)
