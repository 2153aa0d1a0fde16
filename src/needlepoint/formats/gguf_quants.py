"""GGUF tensor payloads to float32, through the weight-type table (`kernels.wtypes`: one
record per ggml type, its block layout and its dequantiser, ggml's values bit for bit).

The float numerics read every tensor this way. Any ggml type the table lacks (IQ types other
than IQ4_NL, TQ, ...) goes through the `gguf` package's own numpy decoders
(`gguf.quants.dequantize`); a type it cannot decode either is an `UnsupportedTensorTypeError`
naming the tensor. F32 payloads stay views of the mapped file.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedTensorTypeError
from ..kernels.wtypes import TYPES

F32 = np.float32


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The float32 tensor `shape` (numpy order: rows last-but-one) of a tensor's raw payload."""
    try:
        if type_name == "F32":
            values = np.ascontiguousarray(raw).view(np.uint8).view("<f4")
        elif type_name in TYPES:
            wtype = TYPES[type_name]
            data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
            if data.size % wtype.block_bytes:
                raise ValueError(f"{data.size} bytes is not a whole number of "
                                 f"{wtype.block_bytes}-byte blocks")
            values = wtype.dequantize(data.reshape(-1, wtype.block_bytes))
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
            f"(needlepoint decodes {', '.join(TYPES)} and what gguf.quants supports): "
            f"{error!r}") from None
