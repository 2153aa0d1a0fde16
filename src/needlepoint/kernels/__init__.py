"""Numeric kernels: the Walsh-Hadamard transform and Cactus-Quants weights."""

from .cq import (
    dequantize,
    dequantize_row,
    dequantize_rows,
    matmul,
    matvec,
    rotated_weights,
    unpack_indices,
)
from .fwht import fwht, fwht_groups, hadamard_matrix

__all__ = [
    "dequantize",
    "dequantize_row",
    "dequantize_rows",
    "fwht",
    "fwht_groups",
    "hadamard_matrix",
    "matmul",
    "matvec",
    "rotated_weights",
    "unpack_indices",
]
