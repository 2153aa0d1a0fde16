"""The packed Cactus-Quants (CQ) matrix type the kernels work on (fixture README "CQ tensors").

It sits in `kernels/` (the bottom layer) so both the archive reader, which makes them as
zero-copy views of its memory map, and the kernels, which multiply them, can import it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CQTensor:
    """A Cactus-Quant matrix: packed codebook indices plus one FP16 norm per row and group.

    `packed` is [rows, in_pad * storage_bits / 8] uint8 and `norms` [rows, in_pad / group]
    float16, both zero-copy views into the archive; its type is `kernels.wtypes.cq_type(bits)`.
    """

    name: str
    rows: int
    cols: int
    bits: int
    group: int
    packed: np.ndarray
    norms: np.ndarray
    codebook: np.ndarray

    @property
    def in_pad(self) -> int:
        return self.norms.shape[1] * self.group

    @property
    def storage_bits(self) -> int:
        """Stored bits per index, read off the codes plane's width (the weight-type table,
        `kernels.wtypes`, says which width each `bits` code has: the reader sized the plane)."""
        in_pad = self.in_pad
        return self.packed.shape[1] * 8 // in_pad if in_pad else 0

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.norms.nbytes
