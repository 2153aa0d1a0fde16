"""A whole int8 block in one native call (`i8_block` in `kernels/native/np_i8_block.h`).

`block.block_forward` with int8 weights calls a dozen kernels and numpy operations per block;
at one position (a decode step) the interpreter's work between them costs as much as the
products. `FusedBlock` describes one block to the C kernel once (geometry, the weights:
packed `I8Weight`s or `BlockWeight`s read as their file stores them, norm weights, biases:
`kernels.i8_native.Layer`) and runs the same operations in the same order in C, so the bits
are those of `block_forward` (tests/models/transformer/test_transformer_int8_fused.py).
`fused_blocks` builds them for a model whose every block is int8 when the native library is
built, else returns None (the model then runs `block_forward`).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import fields

import numpy as np

from ...errors import NonFiniteActivationError
from ...kernels import i8_native, native
from ...kernels.blockweight import BlockWeight
from ...kernels.i8 import I8Weight
from .int8 import Int8KVCache, PinnedNorm
from .linear import Int8Linear
from .spec import BlockSpec
from .weights import LayerWeights, TransformerWeights

F32 = np.float32


def address(array: np.ndarray | None) -> int:
    """The data address of an array, 0 for None."""
    return 0 if array is None else array.ctypes.data


class FusedBlock:
    """One int8 block as the C kernel's `i8_layer`; keeps what it points to alive."""

    def __init__(self, spec: BlockSpec, layer: LayerWeights, index: int) -> None:
        lib = native.library()
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
            n1w=address(layer.norm1.weight), n1b=address(layer.norm1.bias),
            n2w=address(layer.norm2.weight), n2b=address(layer.norm2.bias),
            qkv=self._lin(layer.qkv), o=self._lin(layer.o), up=self._lin(up),
            down=self._lin(layer.down),
        )
        self._keep += [layer.norm1, layer.norm2]
        self.pointer = ctypes.pointer(self.layer)

    def _lin(self, linear: Int8Linear) -> i8_native.Lin:
        parts = (i8_native.Part * len(linear.parts))(*[_part(p) for p in linear.parts])
        self._keep += [linear, parts]
        return i8_native.Lin(parts=parts, n_parts=len(linear.parts), k_in=linear.in_features,
                             k_pad=linear.k_pad, n_total=linear.out_features,
                             bias=address(linear.bias))

    def __call__(self, h: np.ndarray, cache: Int8KVCache, start: int,
                 rope: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """The block's output for h [T, d] at positions start.. (a new array); appends the
        chunk's keys and values to `cache`."""
        out = np.array(h, F32, order="C", copy=True)
        cos, sin = rope_arrays(rope)
        return self.run(out, out.ctypes.data, cache, start, address(cos), address(sin))

    def run(self, h: np.ndarray, address: int, cache: Int8KVCache, start: int, cos: int,
            sin: int) -> np.ndarray:
        """The block on h [T, d] in place (a C-contiguous float32 array at `address`), RoPE
        tables at addresses cos / sin (0 without RoPE: `rope_arrays`); returns h."""
        count = h.shape[0]
        if cache.length != start:
            raise ValueError(f"cache holds {cache.length} positions, the chunk starts at {start}")
        cache.reserve(start + count)
        kcode, kscale, vcode, vscale = cache.addresses()
        status = self.lib.i8_block(self.pointer, address, count, start, cos, sin, kcode, kscale,
                                   vcode, vscale)
        if status == 1:
            raise NonFiniteActivationError("non-finite activation in an int8 block")
        if status:
            raise MemoryError(f"i8_block failed ({status})")
        cache.length = start + count
        return h


def _part(p: I8Weight | BlockWeight) -> i8_native.Part:
    """The C kernel's `i8_part` of one weight part: packed (wtype 0) or as its file stores it
    (the type's native id, the rows' address and stride)."""
    if isinstance(p, BlockWeight):
        return i8_native.Part(n_out=p.n_out, nb=p.blocks, threads=p.threads,
                              wtype=p.wtype.native_id, data=address(p.data),
                              row_bytes=p.row_stride)
    return i8_native.Part(n_out=p.n_out, groups=p.groups, nb=p.blocks, bits=p.bits,
                          threads=p.threads, half=int(p.half), data=address(p.data),
                          scale=address(p.scale), offset=address(p.offset))


def rope_arrays(rope: tuple[np.ndarray, np.ndarray] | None
                ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """cos, sin as C-contiguous float32 (the caller keeps them alive while their addresses
    are in use), or None, None without RoPE."""
    if rope is None:
        return None, None
    cos, sin = (np.ascontiguousarray(a, F32) for a in rope)
    return cos, sin


# What the kernel computes, as an allow-list: the BlockSpec fields it handles at any value
# (the geometry, the pre-norm block's choices, the special ids, what happens outside the
# blocks: the embedding scale, the final soft-cap), and per layer only full attention with
# one RoPE theta for every layer. Any other field must be at its default, so a field added
# to the spec runs the Python block until the kernel is taught it.
ANY_VALUE = frozenset((
    "architecture", "vocab", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
    "d_ff", "max_seq_len", "norm", "norm_eps", "gated", "activation", "rope", "rope_theta",
    "learned_positions", "qkv_fused", "qkv_bias", "out_bias", "mlp_bias", "norm_bias",
    "tied_embeddings", "attn_scale", "scale_by_layer", "bos_id", "eos_id", "embed_scale",
    "final_softcap"))


def kernel_computes(spec: BlockSpec) -> bool:
    """Whether the fused kernel computes `spec`'s blocks (the allow-list above)."""
    for item in fields(spec):
        if item.name == "layers":
            if (any(layer.window is not None for layer in spec.layers)
                    or len({layer.theta for layer in spec.layers}) > 1):
                return False
        elif item.name not in ANY_VALUE and getattr(spec, item.name) != item.default:
            return False
    return True


def fusable(spec: BlockSpec, layer: LayerWeights) -> bool:
    linears = [layer.qkv, layer.o, layer.down, layer.gate_up if spec.gated else layer.up]
    return (all(isinstance(lin, Int8Linear) for lin in linears)
            and isinstance(layer.norm1, PinnedNorm) and isinstance(layer.norm2, PinnedNorm))


def fused_blocks(spec: BlockSpec, weights: TransformerWeights) -> list[FusedBlock | None] | None:
    """One FusedBlock per block held (None for blocks another part holds), or None (float
    weights, a block the kernel does not compute (`kernel_computes`), or no native library)."""
    if native.library() is None or not kernel_computes(spec):
        return None
    held = [layer for layer in weights.layers if layer is not None]
    if not all(fusable(spec, layer) for layer in held):
        return None
    return [None if layer is None else FusedBlock(spec, layer, i)
            for i, layer in enumerate(weights.layers)]
