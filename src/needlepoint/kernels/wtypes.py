"""The weight types: one record per storage type (ggml's `type_traits`), the one place that
says how a type's blocks are laid out, which activations its exact product multiplies, which
kernels compute that product, how a row of it is gathered and how it is dequantised.

`TYPES` holds every record (`kernels.wtype_record.WeightType`):

* the GGUF integer types (`kind="block"`): `unpack(rows u8 [R, row_bytes]) ->
  wtypes_unpack.Unpacked` gives the generic form both the numpy reference and the C kernels
  compute (`kernels/wtypes_unpack.py` holds the layouts; `kernels/native/np_wt.h` the C unpack
  of each, selected by `native_id`); the product over that form is `kernels.blockweight`
  (A8 blocks of 32). `dequantize(rows) -> float32 [R, values]` is ggml's dequantisation bit
  for bit (tested against `gguf.quants`).
* the float types F32, F16, BF16 (`kind="float"`, `unpack=None`): in int8 numerics a 2-D float
  weight is turned once into int8 blocks of 32 (`kernels.i8`, or `to_q8_0`).
* the Needle Cactus-Quant types CQ1, CQ2, CQ3, CQ4 and CQT (ternary) of `.cact` archives
  (`kind="cq"`, found by the archive's `bits` code with `cq_type`): a row is groups of 128
  values, each `128 * storage_bits / 8` bytes of LSB-first codebook indices (the codes plane
  `CQTensor.packed`) plus one FP16 norm (the norms plane), the archive's own bytes. Their
  exact product is `kernels.exact` (A8 rows rotated per 128-group, native entry
  `np_cq_matmul_threads` taking `storage_bits`, the same bits as `cq_matmul_reference`), their
  row gather and dequantiser `kernels.cq` (`dequantize_rows` / `dequantize`).

Adding a GGUF type: its entry in `_TABLE` (ggml id, block geometry, a new `native_id`), its
numpy unpacker in `wtypes_unpack.py`, its C unpack in `np_wt.h`, and tests in
`tests/kernels/test_wtypes.py`. A CQ type: its line in `_CQ_TABLE` and, if its storage width
is new, its cases in `kernels/cq.py` and `native/np_cq*.h` (docs/architecture.md, "Where does
a change go").
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedTensorTypeError
from . import blockweight, cq, exact
from . import wtypes_unpack as wu
from .wtype_record import A8_ROTATED, CONVERTED, WeightType

F32 = np.float32


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

    return WeightType(name, ggml_id, values, size, native_id, unpack, dequantize,
                      product=blockweight.matmul, product_reference=blockweight.matmul_reference,
                      gather=_gather(dequantize))


def _gather(dequantize):
    def gather(data: np.ndarray, rows) -> np.ndarray:
        """float32 rows `rows` of the stored rows `data` (only those rows are read)."""
        return dequantize(np.asarray(data)[np.asarray(rows, np.intp).reshape(-1)])

    return gather


def _float(name: str, ggml_id: int, size: int) -> WeightType:
    def dequantize(data: np.ndarray) -> np.ndarray:
        rows = _rows(data)
        flat = np.ascontiguousarray(rows)
        if name == "BF16":
            out = (flat.view("<u2").astype(np.uint32) << np.uint32(16)).view(F32)
        else:
            out = flat.view({"F32": "<f4", "F16": "<f2"}[name]).astype(F32)
        return out.reshape(rows.shape[0], -1)

    def gather(data: np.ndarray, rows) -> np.ndarray:
        """float32 rows of stored rows: uint8 bytes, or an array of the type's own values
        (an archive's FP16 table)."""
        data = np.asarray(data)
        if data.dtype == np.uint8:
            return _gather(dequantize)(data, rows)
        return data[np.asarray(rows, np.intp).reshape(-1)].astype(F32)

    return WeightType(name, ggml_id, 1, size, 0, None, dequantize, kind="float",
                      activation=CONVERTED, native_entry="", gather=gather)


def _cq(name: str, code: int, storage_bits: int, levels: int, native_gather: bool
        ) -> WeightType:
    return WeightType(
        name, -1, exact.GROUP, exact.GROUP * storage_bits // 8 + 2, storage_bits, None,
        cq.dequantize, kind="cq", activation=A8_ROTATED, native_entry="np_cq_matmul_threads",
        product=exact.cq_matmul, product_reference=exact.cq_matmul_reference,
        gather=cq.table_rows, code=code, storage_bits=storage_bits, codebook_len=levels,
        native_gather=native_gather, layout=exact.storage_layout(storage_bits))


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

_CQ_TABLE = [
    # name, the archive's `bits` code, stored bits per index, codebook levels (README "CQ
    # tensors": 1 binary, 2-4 the header codebooks, 5 ternary in 2-bit crumbs), whether the
    # native Needle 3 step gathers its rows (2- and 4-bit storage)
    ("CQ1", 1, 1, 2, False),
    ("CQ2", 2, 2, 4, True),
    ("CQ3", 3, 3, 8, False),
    ("CQ4", 4, 4, 16, True),
    ("CQT", 5, 2, 4, True),
]

TYPES: dict[str, WeightType] = {
    **{row[0]: _integer(*row) for row in _TABLE},
    "F32": _float("F32", 0, 4), "F16": _float("F16", 1, 2), "BF16": _float("BF16", 30, 2),
    **{row[0]: _cq(*row) for row in _CQ_TABLE},
}
# the CQ types by the archive record's `bits` code
CQ_CODES: dict[int, WeightType] = {t.code: t for t in TYPES.values() if t.kind == "cq"}
# the types whose blocks carry an offset (m * u): the others' m and u are all zero
OFFSET_TYPES = frozenset(row[0] for row in _TABLE if row[6])


def _find(table: dict, key, unknown: str) -> WeightType:
    found = table.get(key)
    if found is None:
        raise UnsupportedTensorTypeError(unknown)
    return found


def weight_type(name: str) -> WeightType:
    """The record of storage type `name` (a GGUF type name such as "Q4_K")."""
    return _find(TYPES, name, f"weight type {name} has no integer product or decoder here "
                              f"(known: {', '.join(TYPES)})")


def cq_type(code: int) -> WeightType:
    """The CQ type of an archive record's `bits` code."""
    known = ", ".join(f"{t.code} ({t.name})" for t in CQ_CODES.values())
    return _find(CQ_CODES, code, f"CQ code {code} has no weight type (known: {known})")


def cq_bytes(wtype: WeightType, rows: int, cols: int, group: int) -> tuple[int, int]:
    """(code bytes per row, norms per row) of a CQ tensor [rows, cols] stored in groups of
    `group` (the archive's; 128 for every exact product): codes plane then FP16 norms."""
    in_pad = -(-cols // group) * group
    return in_pad * wtype.storage_bits // 8, in_pad // group


def cq_tensor_bytes(wtype: WeightType, rows: int, cols: int, group: int) -> int:
    """Blob bytes of a CQ tensor: `rows` rows of codes, then `rows` rows of FP16 norms."""
    codes, norms = cq_bytes(wtype, rows, cols, group)
    return rows * (codes + 2 * norms)


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
