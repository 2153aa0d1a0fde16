"""A whole int8 block in one native call (`i8_block` in `kernels/native/np_i8_block.h`).

`block.block_forward` with int8 weights calls a dozen kernels and numpy operations per block;
at one position (a decode step) the interpreter's work between them costs as much as the
products. `FusedBlock` describes one block to the C kernel once (geometry, the packed weights,
norm weights, biases: `kernels.i8_native.Layer`) and runs the same operations in the same order
in C, so the bits are those of `block_forward` (tests/models/transformer/
test_transformer_int8_fused.py). `fused_blocks` builds them for a model whose every block is
int8 when the native library is built, else returns None (the model then runs
`block_forward`).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ...errors import NonFiniteActivationError
from ...kernels import i8_native
from .int8 import Int8KVCache, PinnedNorm
from .linear import Int8Linear
from .spec import BlockSpec
from .weights import LayerWeights, TransformerWeights

F32 = np.float32


def _address(array: np.ndarray | None) -> int:
    return 0 if array is None else array.ctypes.data


class FusedBlock:
    """One int8 block as the C kernel's `i8_layer`; keeps what it points to alive."""

    def __init__(self, spec: BlockSpec, layer: LayerWeights, index: int) -> None:
        lib = i8_native.LIBRARY
        if lib is None:
            raise RuntimeError("the native int8 kernels are not built")
        self.lib = lib
        self._keep: list = []
        up = layer.gate_up if spec.gated else layer.up
        scale = spec.attn_scale / (index + 1) if spec.scale_by_layer else spec.attn_scale
        self.layer = i8_native.Layer(
            d=spec.d_model, heads=spec.num_heads, kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim, d_ff=spec.d_ff, gated=int(spec.gated),
            gelu=int(spec.activation == "gelu_tanh"), center=int(layer.norm1.center),
            rope=int(spec.rope), eps=layer.norm1.eps,
            factor=float(F32(scale * math.sqrt(spec.head_dim))),
            n1w=_address(layer.norm1.weight), n1b=_address(layer.norm1.bias),
            n2w=_address(layer.norm2.weight), n2b=_address(layer.norm2.bias),
            qkv=self._lin(layer.qkv), o=self._lin(layer.o), up=self._lin(up),
            down=self._lin(layer.down),
        )
        self._keep += [layer.norm1, layer.norm2]
        self.pointer = ctypes.pointer(self.layer)

    def _lin(self, linear: Int8Linear) -> i8_native.Lin:
        parts = (i8_native.Part * len(linear.parts))(*[
            i8_native.Part(n_out=p.n_out, groups=p.groups, nb=p.blocks, bits=p.bits,
                           threads=p.threads, half=int(p.half), data=_address(p.data),
                           scale=_address(p.scale),
                           offset=_address(p.offset))
            for p in linear.parts])
        self._keep += [linear, parts]
        return i8_native.Lin(parts=parts, n_parts=len(linear.parts), k_in=linear.in_features,
                             k_pad=linear.k_pad, n_total=linear.out_features,
                             bias=_address(linear.bias))

    def __call__(self, h: np.ndarray, cache: Int8KVCache, start: int,
                 rope: tuple[np.ndarray, np.ndarray] | None, inplace: bool = False
                 ) -> np.ndarray:
        """The block's output for h [T, d] at positions start.. (a new array, or h itself
        when `inplace` and h is a C-contiguous float32 array); appends the chunk's keys and
        values to `cache`."""
        if inplace and h.dtype == F32 and h.flags.c_contiguous and h.flags.writeable:
            out = h
        else:
            out = np.array(h, F32, order="C", copy=True)
        count = out.shape[0]
        if cache.length != start:
            raise ValueError(f"cache holds {cache.length} positions, the chunk starts at {start}")
        cache.reserve(start + count)
        cos = sin = None
        if rope is not None:
            cos, sin = (np.ascontiguousarray(a, F32) for a in rope)
        status = self.lib.i8_block(self.pointer, out.ctypes.data, count, start, _address(cos),
                                   _address(sin), cache.kcode.ctypes.data,
                                   cache.kscale.ctypes.data, cache.vcode.ctypes.data,
                                   cache.vscale.ctypes.data)
        if status == 1:
            raise NonFiniteActivationError("non-finite activation in an int8 block")
        if status:
            raise MemoryError(f"i8_block failed ({status})")
        cache.length = start + count
        return out


def fusable(spec: BlockSpec, layer: LayerWeights) -> bool:
    linears = [layer.qkv, layer.o, layer.down, layer.gate_up if spec.gated else layer.up]
    return (all(isinstance(lin, Int8Linear) for lin in linears)
            and isinstance(layer.norm1, PinnedNorm) and isinstance(layer.norm2, PinnedNorm))


def fused_blocks(spec: BlockSpec, weights: TransformerWeights) -> list[FusedBlock | None] | None:
    """One FusedBlock per block held (None for blocks another part holds), or None (float
    weights, or no native library)."""
    if i8_native.LIBRARY is None or weights.numerics != "int8":
        return None
    held = [layer for layer in weights.layers if layer is not None]
    if not all(fusable(spec, layer) for layer in held):
        return None
    return [None if layer is None else FusedBlock(spec, layer, i)
            for i, layer in enumerate(weights.layers)]
