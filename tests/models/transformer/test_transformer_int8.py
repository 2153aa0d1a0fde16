"""int8 numerics on the shared/fixtures/hf models: batch-invariant bits (forward, prefill at any
chunk size, step by step, 1 or 2 BLAS / kernel threads, native kernels or their numpy
references all give the same logits bits), GGUF integer blocks used as stored, and int8's
distance from transformers' float logits within int8 quantisation error."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import toy_model_path
from hf_helpers import ALL_HF_FIXTURES, hf_reference, write_fixture_gguf
from threadpoolctl import threadpool_limits

import needlepoint
from needlepoint.formats.checkpoints import open_checkpoint
from needlepoint.kernels import i8, i8_native, native
from needlepoint.models.transformer.linear import Int8Linear
from needlepoint.models.transformer.model import TransformerModel

# int8 against transformers' float32 logits (logits of order 1; measured: llama-tiny max 0.67,
# mean 0.071; gpt2-tiny max 0.20, mean 0.029; qwen2-tiny max 0.69, mean 0.064, top-1 0.875;
# qwen3-tiny 0.38, 0.044, 0.92; gemma3-tiny 0.27, 0.031, 0.97; a float32 engine is within 1e-4)
DISTANCE = {"llama-tiny": (1.0, 0.1, 0.8), "gpt2-tiny": (0.4, 0.05, 0.9),
            "qwen2-tiny": (1.0, 0.1, 0.8), "qwen3-tiny": (0.6, 0.07, 0.85),
            "gemma3-tiny": (0.4, 0.05, 0.9)}


@pytest.fixture(scope="module")
def models():
    return {name: needlepoint.load(hf_reference(name).folder, numerics="int8")
            for name in ALL_HF_FIXTURES}


def test_numerics_names() -> None:
    ref = hf_reference("llama-tiny")
    assert needlepoint.load(ref.folder, numerics="deploy").numerics == "int8"
    assert needlepoint.load(ref.folder).numerics == "int8"  # deploy is the default
    assert needlepoint.load(ref.folder, numerics="float").numerics == "float"
    with pytest.raises(ValueError, match="numerics"):
        needlepoint.load(ref.folder, numerics="int4")
    with pytest.raises(ValueError, match="transformer"):  # .cact archives keep their numerics
        needlepoint.load(toy_model_path(), numerics="int8")


@pytest.mark.parametrize("name", ALL_HF_FIXTURES)
def test_every_product_is_int8_and_logits_are_within_int8_error(models, name) -> None:
    ref, model = hf_reference(name), models[name]
    layer = model.weights.layers[0]
    assert isinstance(layer.qkv, Int8Linear) and isinstance(model.weights.lm_head, Int8Linear)
    assert all(isinstance(getattr(layer, n), Int8Linear) for n in ("o", "down"))
    worst, means, agree = 0.0, [], []
    for prompt in ref.prompts:
        i = prompt["index"]
        logits = model.forward(ref[f"p{i}_ids"])
        expect = ref[f"p{i}_logits"]
        diff = np.abs(logits - expect)
        worst = max(worst, float(diff.max()))
        means.append(float(diff.mean()))
        agree.append(float(np.mean(logits.argmax(-1) == expect.argmax(-1))))
    top, mean, top1 = DISTANCE[name]
    assert worst <= top and max(means) <= mean and min(agree) >= top1, (worst, means, agree)


@pytest.mark.parametrize("name", ALL_HF_FIXTURES)
def test_forward_prefill_chunks_and_steps_give_the_same_bits(models, name) -> None:
    ref, model = hf_reference(name), models[name]
    ids = ref["p3_ids"].tolist()  # > 300 tokens
    full = model.forward(ids)
    for chunk in (1, 5, 64, 1000):
        session = model.session(chunk=chunk)
        np.testing.assert_array_equal(session.run(ids[:150], "all"), full[:150])
        np.testing.assert_array_equal(session.prefill(ids[150:]), full[-1])
    session = model.session(chunk=3)
    assert session.prefill(ids[:40], logits=False) is None
    fork = session.fork()
    for position in range(40, len(ids)):
        np.testing.assert_array_equal(session.step(ids[position]), full[position])
    np.testing.assert_array_equal(fork.step(ids[40]), full[40])
    with pytest.raises(ValueError, match="chunk"):
        model.session(chunk=0)


@pytest.mark.parametrize("name", ALL_HF_FIXTURES)
def test_threads_blas_and_numpy_references_give_the_same_bits(models, name, monkeypatch
                                                              ) -> None:
    ref = hf_reference(name)
    ids = ref["p2_ids"]
    with threadpool_limits(limits=1):
        one = models[name].forward(ids)
    two_threads = TransformerModel.from_checkpoint(open_checkpoint(ref.folder),
                                                   numerics="int8", threads=2)
    assert two_threads.weights.lm_head.parts[0].threads == 2
    with threadpool_limits(limits=2):
        np.testing.assert_array_equal(two_threads.forward(ids), one)
        np.testing.assert_array_equal(models[name].forward(ids), one)
    assert i8_native.LIBRARY is not None
    monkeypatch.setattr(i8_native, "LIBRARY", None)  # every kernel: its numpy reference
    monkeypatch.setattr(native, "LIBRARY", None)  # (the int8 path does not use this one)
    np.testing.assert_array_equal(models[name].forward(ids[:60]), one[:60])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_gguf_integer_blocks_run_as_stored(qtype, tmp_path) -> None:
    """A GGUF weight enters the int8 product unchanged: the product equals the float path's
    dequantised weight times the int8-quantised activation, up to float64 rounding."""
    path = write_fixture_gguf("llama-tiny", tmp_path / f"llama-{qtype}.gguf", qtype)
    int8 = needlepoint.load(path, numerics="int8")
    flt = needlepoint.load(path, numerics="float")
    x = np.random.default_rng(0).standard_normal((5, 128)).astype(np.float32)
    codes, scale, _ = i8.quantize(x, 128)
    seen = (codes.reshape(5, 4, 32) * scale[:, :, None].astype(np.float64)).reshape(5, 128)
    pairs = [(int8.weights.layers[1].qkv, flt.weights.layers[1].q, 0),
             (int8.weights.layers[1].gate_up, flt.weights.layers[1].up, 352),
             (int8.weights.lm_head, flt.weights.lm_head, 0)]
    for fused, plain, column in pairs:
        expect = seen @ plain.weight.astype(np.float64)
        got = fused(x)[:, column : column + plain.out_features]
        assert np.abs(got - expect).max() <= 1e-6 * np.abs(expect).max()
    assert [p.wtype.name for p in int8.weights.layers[0].qkv.parts] == [qtype] * 3
    ref = hf_reference("llama-tiny")
    logits = int8.forward(ref["p1_ids"])
    np.testing.assert_array_equal(int8.session(chunk=4).prefill(ref["p1_ids"]), logits[-1])
    same_weights = flt.forward(ref["p1_ids"])  # the float path on the same stored weights
    assert np.mean(logits.argmax(-1) == same_weights.argmax(-1)) >= 0.8
