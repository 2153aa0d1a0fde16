"""Blocks whose int8 projections are `BlockWeight`s (weights as a GGUF file stores them,
`kernels.blockweight`) run fused (one native call per block) with the bits of the block run
kernel by kernel, in every variant this CPU runs, mixed with packed `I8Weight` parts."""

from __future__ import annotations

import numpy as np
from hf_helpers import hf_reference

import needlepoint
from needlepoint.kernels import i8, i8_native, wtypes
from needlepoint.kernels.blockweight import BlockWeight
from needlepoint.models.transformer.linear import Int8Linear

F32 = np.float32


def _float_rows(part: i8.I8Weight) -> np.ndarray:
    codes = part.codes()[: part.n_out].astype(F32)
    scale, offset = part.scales()
    w = codes.reshape(part.n_out, part.blocks, 32) * scale[: part.n_out, :, None]
    if offset is not None:
        w = w + offset[: part.n_out, :, None]
    return w.reshape(part.n_out, -1)[:, : part.k_in]


def _as_blocks(lin: Int8Linear) -> Int8Linear:
    """The same projection as two Q8_0 BlockWeight parts (rows split unevenly)."""
    w = np.concatenate([_float_rows(p) for p in lin.parts])
    cut = w.shape[0] // 3 + 1
    q8 = wtypes.weight_type("Q8_0")
    parts = [BlockWeight(q8, wtypes.to_q8_0(rows), rows.shape[0], w.shape[1])
             for rows in (w[:cut], w[cut:])]
    return Int8Linear(parts, lin.bias)


def test_fused_blocks_with_block_weight_parts_equal_block_forward() -> None:
    ref = hf_reference("qwen2-tiny")
    model = needlepoint.load(ref.folder, numerics="int8")
    for layer in model.weights.layers:
        layer.qkv = _as_blocks(layer.qkv)  # q|k|v as blocks (with biases)
        layer.gate_up = _as_blocks(layer.gate_up)  # o and down stay packed I8Weights
    assert model.native_blocks() is not None
    ids = ref["p3_ids"][:40].tolist()
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        i8_native.LIBRARY.np_force_variant(variant)
        try:
            out = {}
            for fused in (True, False):
                model.fused = fused
                session = model.session(chunk=16)
                prefix = session.run(ids[:-3], "all")
                out[fused] = (prefix, np.stack([session.step(t) for t in ids[-3:]]))
        finally:
            model.fused = True
            i8_native.LIBRARY.np_force_variant(2)
        for a, b in zip(out[True], out[False], strict=True):
            np.testing.assert_array_equal(a, b)
        assert np.isfinite(out[True][0]).all()
