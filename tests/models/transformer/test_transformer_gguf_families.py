"""GGUF files of every transformer family give the safetensors logits (issue 28 item 2): the
fixtures written as llama.cpp's converter writes them (`write_fixture_gguf` for llama-tiny,
q/k permuted; `write_family_gguf` for Qwen2 / Qwen3 / Gemma 3, unpermuted, Gemma's norms
stored `1 + w`) reproduce the transformers references of every prompt in float numerics, and
in int8 numerics give the same bits as the safetensors directory (same weights, same
quantisation at load)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf_family_helpers import FAMILY_FIXTURES, write_family_gguf
from hf_helpers import assert_logits_match, greedy_tokens, hf_reference, write_fixture_gguf
from wtype_helpers import maps_the_file

import needlepoint

FIXTURES = ("llama-tiny", *FAMILY_FIXTURES)


def _gguf(name: str, folder) -> str:
    path = folder / f"{name}.gguf"
    if name in FAMILY_FIXTURES:
        return write_family_gguf(name, path)
    return write_fixture_gguf(name, path)


@pytest.fixture(scope="module")
def gguf_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf_families_logits")
    return {name: _gguf(name, folder) for name in FIXTURES}


@pytest.mark.parametrize("name", FIXTURES)
def test_gguf_float_logits_match_transformers(gguf_paths, name) -> None:
    ref = hf_reference(name)
    model = needlepoint.load(gguf_paths[name], numerics="float")
    assert model.checkpoint.format == "gguf"
    assert_logits_match(model, ref, 1e-4)
    tokens = greedy_tokens(model, ref["p2_ids"].tolist(), len(ref["p2_greedy"]))
    assert tokens == ref["p2_greedy"].tolist()


@pytest.mark.parametrize("name", FIXTURES)
def test_gguf_int8_logits_equal_the_safetensors_int8_logits(gguf_paths, name) -> None:
    ref = hf_reference(name)
    from_gguf = needlepoint.load(gguf_paths[name], numerics="int8")
    from_safetensors = needlepoint.load(ref.folder, numerics="int8")
    for i in (1, 2):
        ids = ref[f"p{i}_ids"]
        np.testing.assert_array_equal(from_gguf.forward(ids), from_safetensors.forward(ids))


@pytest.mark.parametrize("name", ["qwen3-tiny", "gemma3-tiny"])
def test_q4_k_m_style_gguf_runs_its_k_quants_as_stored_in_int8(tmp_path, name) -> None:
    """`ffn_down` Q4_K (even layers) / Q6_K (odd), the rest Q8_0: in int8 numerics every one
    enters as the file stores it (a `BlockWeight` whose bytes are the file's own); the
    prefill is the forward's bits at any chunk, and the argmax agrees with the float path on
    the same file (the same dequantised weights) at most positions."""
    from gguf_family_helpers import write_family_gguf as write

    path = write(name, tmp_path / f"{name}-q4km.gguf", "Q4_K_M")
    int8 = needlepoint.load(path, numerics="int8")
    flt = needlepoint.load(path, numerics="float")
    layers = int8.weights.layers
    stored = {i: layers[i].down.parts[0] for i in (0, 1)}
    assert [stored[i].wtype.name for i in (0, 1)] == ["Q4_K", "Q6_K"]
    assert layers[0].qkv.parts[0].wtype.name == "Q8_0"
    for weight in stored.values():  # views of the mapped file: nothing was copied
        assert maps_the_file(weight.data)
    ids = hf_reference(name)["p3_ids"][:120]
    logits = int8.forward(ids)
    np.testing.assert_array_equal(int8.session(chunk=7).prefill(ids.tolist()), logits[-1])
    assert np.mean(logits.argmax(-1) == flt.forward(ids).argmax(-1)) >= 0.8
