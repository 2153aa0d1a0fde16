"""SmolLM2-135M-Instruct (Q4_1 GGUF) in int8 numerics against llama.cpp's recorded output
(`smollm2_llamacpp.json`, made by `bench/record_llamacpp.py`): the Q4_1 matrices and the Q8_0
embedding run as the file stores them, and with llama.cpp's tokens fed back our argmax
is llama.cpp's wherever its margin is clear; prefill and steps give the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from hf_helpers import (  # noqa: F401 (the `reference` fixture, requested by name)
    smollm2_reference,
    teacher_forced_binding_steps,
)

import needlepoint

BINDING_MARGIN = 1.0
LOGIT_SPREAD = 1.5  # |ours - llama.cpp| on the recorded top-5 logits (int8 measured: 1.27)


@pytest.fixture(scope="module")
def model(reference):
    return needlepoint.load(reference.path, numerics="int8")


def test_weights_run_as_stored(model) -> None:
    layer = model.weights.layers[0]
    assert [p.wtype.name for p in layer.qkv.parts] == ["Q4_1"] * 3
    assert layer.qkv.out_features == 960
    assert [p.wtype.name for p in layer.gate_up.parts] == ["Q4_1"] * 2
    assert layer.down.parts[0].wtype.name == "Q4_1"
    head = model.weights.lm_head.parts[0]
    assert head.wtype.name == "Q8_0" and head.n_out == 49152
    # the tied embedding is read from the LM head's own Q8_0 blocks: the float path's values
    rows = model.weights.embed[np.array([0, 7, 12345, 49151])]
    stored = model.checkpoint.tensor("model.embed_tokens.weight")[[0, 7, 12345, 49151]]
    np.testing.assert_array_equal(rows, stored)
    assert model.weights.embed.weight is head  # one table for both
    assert model.weights.nbytes < 120e6  # the file's Q4_1 and Q8_0 blocks


def test_teacher_forced_steps_agree_with_llama_cpp(model, reference) -> None:
    checked = teacher_forced_binding_steps(model, reference, spread=LOGIT_SPREAD,
                                           margin=BINDING_MARGIN)
    assert checked >= 35


def test_prefill_chunks_and_steps_give_the_same_bits(model, reference) -> None:
    ids = reference.prompts[0]["ids"]  # the chat prompt
    whole = model.session().prefill(ids)
    chunked = model.session(chunk=5)
    np.testing.assert_array_equal(chunked.prefill(ids), whole)
    stepped = model.session()
    stepped.prefill(ids[:1], logits=False)
    for token in ids[1:-1]:
        stepped.step(token)
    np.testing.assert_array_equal(stepped.step(ids[-1]), whole)
