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
from hf_helpers import hf_reference, write_fixture_gguf

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
    for prompt in ref.prompts:
        i = prompt["index"]
        error = float(np.abs(model.forward(ref[f"p{i}_ids"]) - ref[f"p{i}_logits"]).max())
        assert error <= 1e-4, (prompt["kind"], error)
    session = model.session()
    logits = session.prefill(ref["p2_ids"].tolist())
    tokens = []
    for _ in range(len(ref["p2_greedy"])):
        tokens.append(int(np.argmax(logits)))
        logits = session.step(tokens[-1])
    assert tokens == ref["p2_greedy"].tolist()


@pytest.mark.parametrize("name", FIXTURES)
def test_gguf_int8_logits_equal_the_safetensors_int8_logits(gguf_paths, name) -> None:
    ref = hf_reference(name)
    from_gguf = needlepoint.load(gguf_paths[name], numerics="int8")
    from_safetensors = needlepoint.load(ref.folder, numerics="int8")
    for i in (1, 2):
        ids = ref[f"p{i}_ids"]
        np.testing.assert_array_equal(from_gguf.forward(ids), from_safetensors.forward(ids))
