"""The fused int8 block (one native call per block, `int8_fused.py`) gives the bits of the
block run kernel by kernel (`block.block_forward` over `Int8Linear`s, pinned norms and
activations, `Int8KVCache`): Llama (RMSNorm, RoPE, GQA, SwiGLU) and GPT-2 (LayerNorm, biases,
learned positions, GELU), Qwen2 (q/k/v biases), also with a per-layer score scale, in every
variant this CPU runs. Blocks the kernel does not compute (Qwen3's and Gemma 3's per-head
norms, Gemma's output norms and sliding windows) run kernel by kernel."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hf_helpers import HF_FIXTURES, hf_reference

import needlepoint
from needlepoint.kernels import i8_native


def _both_paths(model, ids, steps: int = 6):
    """Logits of every position by forward and by prefill + steps, fused and kernel by kernel."""
    out = {}
    for fused in (True, False):
        model.fused = fused
        session = model.session(chunk=64)
        prefix = session.run(ids[:-steps], "all")
        stepped = [session.step(t) for t in ids[-steps:]]
        out[fused] = (model.forward(ids), prefix, np.stack(stepped))
    model.fused = True
    return out


@pytest.mark.parametrize("name", (*HF_FIXTURES, "qwen2-tiny"))
def test_fused_blocks_equal_block_forward(name) -> None:
    ref = hf_reference(name)
    model = needlepoint.load(ref.folder, numerics="int8")
    assert model.native_blocks() is not None and len(model.fused_blocks) == 4
    ids = ref["p3_ids"][:120].tolist()
    for variant in (2, 1, 0):  # AVX-512 VNNI (or the best below it), AVX2, baseline
        i8_native.LIBRARY.np_force_variant(variant)
        try:
            out = _both_paths(model, ids)  # chunks of 64: the KV caches grow mid-prefill
        finally:
            i8_native.LIBRARY.np_force_variant(2)  # back to the best this CPU runs
        for fused, unfused in zip(out[True], out[False], strict=True):
            np.testing.assert_array_equal(fused, unfused)
        full, prefix, stepped = out[True]
        np.testing.assert_array_equal(prefix, full[:-6])
        np.testing.assert_array_equal(stepped, full[-6:])


def test_fused_blocks_with_a_per_layer_score_scale(tmp_path) -> None:
    """GPT-2's scale_attn_by_inverse_layer_idx: q is multiplied by 1/(layer + 1) before its
    int8 codes, in both paths."""
    folder = tmp_path / "gpt2-scaled"
    shutil.copytree(hf_reference("gpt2-tiny").folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["scale_attn_by_inverse_layer_idx"] = True
    (folder / "config.json").write_text(json.dumps(config))
    model = needlepoint.load(folder, numerics="int8")
    assert model.config.scale_by_layer
    ids = hf_reference("gpt2-tiny")["p1_ids"].tolist()
    out = _both_paths(model, ids, steps=4)
    for fused, unfused in zip(out[True], out[False], strict=True):
        np.testing.assert_array_equal(fused, unfused)
    plain = needlepoint.load(hf_reference("gpt2-tiny").folder, numerics="int8").forward(ids)
    assert not np.array_equal(out[True][0], plain)  # the scale did change the attention


@pytest.mark.parametrize("name", ["qwen3-tiny", "gemma3-tiny"])
def test_blocks_the_kernel_does_not_compute_run_kernel_by_kernel(name) -> None:
    model = needlepoint.load(hf_reference(name).folder, numerics="int8")
    assert model.native_blocks() is None and model.fused_blocks is None
