"""The record of one weight (storage) type: the shape of every entry of `kernels.wtypes.TYPES`.

It sits apart from the table so that the kernels the table names (`kernels.blockweight`, which
takes a record as its argument) can import it without importing the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedTensorTypeError

# The activation form a type's exact product multiplies.
A8_BLOCK32 = "A8 blocks of 32 (kernels.i8.quantize)"
A8_ROTATED = "A8 rows, 128-groups rotated by the integer Walsh-Hadamard (kernels.exact.a8_rotate)"
CONVERTED = "none of its own: converted once to int8 blocks of 32 (A8_BLOCK32)"


@dataclass(frozen=True)
class WeightType:
    """One storage type: `block_values` values in `block_bytes` bytes along a row.

    * `kind`: "block" (a GGUF integer type: `unpack` to the generic form, the product of
      `kernels.blockweight`), "float" (F32 / F16 / BF16) or "cq" (a Needle Cactus-Quant type:
      codes and norms of a `kernels.cq_tensor.CQTensor`).
    * `native_id`: the number the C entry `native_entry` takes for this type (0: none); every
      SIMD variant of the entry (`NP_DISPATCH`) takes the same number and gives the same bits.
    * `product(...)` / `product_reference(...)`: the exact integer product (the native kernel
      when it is built / the numpy reference, same bits), over `activation`.
    * `gather(stored, rows)`: float32 rows of a stored table (an embedding); `dequantize(stored)`
      the whole matrix. `stored` is uint8 rows `[R, row_bytes]` for "block" and "float" types,
      a `CQTensor` for "cq" ones.
    * CQ only: `code` (the archive record's `bits` field), `storage_bits` (bits per stored
      code), `codebook_len` (levels in the header codebook of that code), `native_gather` (the
      native Needle 3 step gathers its rows itself: `native/np_v3_rows.h`), `layout` (what a
      load builds beside the packed codes: `kernels.exact.storage_layout`, an interleaved copy
      of 2-bit codes for the lookup kernel, a 16-row blocked copy of 4-bit codes for the
      AVX-512 VNNI kernel).
    """

    name: str
    ggml_id: int
    block_values: int
    block_bytes: int
    native_id: int
    unpack: Callable[[np.ndarray], object] | None
    dequantize: Callable[..., np.ndarray]
    kind: str = "block"
    activation: str = A8_BLOCK32
    native_entry: str = "wt_matmul"
    product: Callable[..., np.ndarray] | None = None
    product_reference: Callable[..., np.ndarray] | None = None
    gather: Callable[..., np.ndarray] | None = None
    code: int = -1
    storage_bits: int = 0
    codebook_len: int = 0
    native_gather: bool = False
    layout: str = ""

    def row_bytes(self, values: int) -> int:
        """Bytes of a row of `values` values (a whole number of blocks)."""
        if values % self.block_values:
            raise UnsupportedTensorTypeError(
                f"{self.name} rows hold whole blocks of {self.block_values} values, "
                f"not {values}")
        return values // self.block_values * self.block_bytes
