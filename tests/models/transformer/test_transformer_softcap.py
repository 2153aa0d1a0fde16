"""Logit soft-capping (Gemma 2, some Gemma 3 exports): `attn_logit_softcapping` on the
attention scores and `final_logit_softcapping` on the logits, each `cap * tanh(x / cap)`
(transformers' `eager_attention_forward` and `Gemma3ForCausalLM.forward`).

The expected logits come from a Gemma 3 forward written out here in numpy, float64, from
transformers' formulas (not from the code under test); it is first checked against the
fixture's own transformers logits with soft-capping off, then run with the caps a copy of the
fixture's config sets. int8 numerics are checked against it within int8 error, and for the
bits of chunked and stepped decoding (the soft-capped attention runs the numpy reference)."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from hf_helpers import hf_fixture_dir, hf_reference

import needlepoint
from needlepoint.errors import CheckpointError
from needlepoint.kernels import pinned
from needlepoint.models.transformer.int8_fused import kernel_computes
from needlepoint.models.transformer.spec import spec_from_config

ATTN_CAP, FINAL_CAP = 0.5, 3.0  # small enough to change every logit a lot


def write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, at = {}, [], 0
    for name, value in tensors.items():
        data = np.ascontiguousarray(value, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape),
                        "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def read_safetensors(path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + size])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info["dtype"]
        lo, hi = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + size + lo : 8 + size + hi], "<f4").reshape(
            info["shape"]).astype(np.float64)
    return out


def gemma3_reference(cfg: dict, w: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Gemma3ForCausalLM's logits [T, vocab] in float64, transformers' formulas written out."""
    d, heads, kv, hd = (cfg[k] for k in ("hidden_size", "num_attention_heads",
                                         "num_key_value_heads", "head_dim"))
    eps, window = cfg["rms_norm_eps"], cfg["sliding_window"]
    acap, fcap = cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping")

    def norm(x, weight):  # Gemma3RMSNorm: x / sqrt(mean x^2 + eps) * (1 + w)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + weight)

    def rope(x, theta):  # x [T, H, hd], the half-split layout
        inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
        angles = np.arange(len(x))[:, None] * inv[None, :]
        cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :]
        sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :]
        half = hd // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    count = len(ids)
    h = w["model.embed_tokens.weight"][ids] * np.float64(np.float32(d ** 0.5))
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        x = norm(h, w[p + "input_layernorm.weight"])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(count, heads, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(count, kv, hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(count, kv, hd)
        if p + "self_attn.q_norm.weight" in w:  # Gemma 3 (Gemma 2 has none)
            q = norm(q, w[p + "self_attn.q_norm.weight"])
            k = norm(k, w[p + "self_attn.k_norm.weight"])
        theta = cfg["rope_parameters"][kind]["rope_theta"] if "rope_parameters" in cfg \
            else cfg["rope_theta"]
        q, k = rope(q, theta), rope(k, theta)
        k, v = np.repeat(k, heads // kv, axis=1), np.repeat(v, heads // kv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) * cfg["query_pre_attn_scalar"] ** -0.5
        if acap:
            scores = acap * np.tanh(scores / acap)
        t, s = np.arange(count)[:, None], np.arange(count)[None, :]
        hidden = (s > t) | ((s <= t - window) if kind == "sliding_attention" else False)
        scores = np.where(hidden, -np.inf, scores)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attended = np.einsum("hts,shd->thd", probs, v).reshape(count, heads * hd)
        attended = attended @ w[p + "self_attn.o_proj.weight"].T
        h = h + norm(attended, w[p + "post_attention_layernorm.weight"])
        x = norm(h, w[p + "pre_feedforward_layernorm.weight"])
        mlp = gelu_tanh(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)
        h = h + norm(mlp @ w[p + "mlp.down_proj.weight"].T,
                     w[p + "post_feedforward_layernorm.weight"])
    logits = norm(h, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T
    return fcap * np.tanh(logits / fcap) if fcap else logits


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A copy of gemma3-tiny whose config sets both soft-caps, its config and weights."""
    source = hf_fixture_dir("gemma3-tiny")
    out = tmp_path_factory.mktemp("softcap") / "gemma3-softcap"
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("reference.*"))
    cfg = json.loads((source / "config.json").read_text())
    cfg.update(attn_logit_softcapping=ATTN_CAP, final_logit_softcapping=FINAL_CAP)
    (out / "config.json").write_text(json.dumps(cfg))
    return out, cfg, read_safetensors(source / "model.safetensors")


def prompt_ids() -> np.ndarray:
    ref = hf_reference("gemma3-tiny")
    return np.asarray(ref["p4_ids"], np.int64)[:70]  # past the 48-position window


def test_the_reference_forward_is_transformers_with_the_caps_off(capped) -> None:
    _, cfg, weights = capped
    ref = hf_reference("gemma3-tiny")
    plain = {**cfg, "attn_logit_softcapping": None, "final_logit_softcapping": None}
    for i in (1, 4):
        got = gemma3_reference(plain, weights, ref[f"p{i}_ids"])
        assert np.abs(got - ref[f"p{i}_logits"]).max() < 1e-4


def test_config_and_spec_fields() -> None:
    cfg = json.loads((hf_fixture_dir("gemma3-tiny") / "config.json").read_text())
    spec = spec_from_config({**cfg, "attn_logit_softcapping": 50, "final_logit_softcapping": 30.0})
    assert (spec.attn_softcap, spec.final_softcap) == (50.0, 30.0)
    assert not kernel_computes(spec)  # the fused native block has no soft-capped attention
    assert spec_from_config({**cfg, "final_logit_softcapping": 0}).final_softcap is None
    with pytest.raises(CheckpointError, match="final_logit_softcapping"):
        spec_from_config({**cfg, "final_logit_softcapping": "big"})


def test_float_forward_honours_both_caps(capped) -> None:
    folder, cfg, weights = capped
    ids = prompt_ids()
    expect = gemma3_reference(cfg, weights, ids)
    uncapped = gemma3_reference({**cfg, "attn_logit_softcapping": None,
                                 "final_logit_softcapping": None}, weights, ids)
    assert np.abs(expect - uncapped).max() > 1.0  # the caps matter here
    model = needlepoint.load(folder, numerics="float")
    assert (model.config.attn_softcap, model.config.final_softcap) == (ATTN_CAP, FINAL_CAP)
    got = model.forward(ids)
    assert np.abs(got - expect).max() < 1e-4
    assert np.abs(got).max() <= FINAL_CAP


def test_int8_forward_honours_both_caps_with_the_same_bits_in_steps(capped) -> None:
    folder, cfg, weights = capped
    ids = prompt_ids()
    expect = gemma3_reference(cfg, weights, ids)
    model = needlepoint.load(folder, numerics="int8")
    got = model.forward(ids)
    diff = np.abs(got - expect)
    assert diff.max() < 0.4 and diff.mean() < 0.05  # int8 error (test_transformer_int8.py)
    assert np.mean(got.argmax(-1) == expect.argmax(-1)) > 0.9
    session = model.session()
    rows = [session.prefill(ids[:30])[None]]
    rows += [session.step(int(t))[None] for t in ids[30:]]
    assert np.array_equal(np.concatenate(rows)[-1], got[-1])
    assert np.array_equal(np.concatenate(rows), got[29:])


def test_the_pinned_softcap_is_the_formula() -> None:
    x = np.linspace(-200, 200, 4001, dtype=np.float32)
    got = pinned.softcap32(x, 30.0)
    assert got.dtype == np.float32
    assert np.abs(got - 30.0 * np.tanh(x.astype(np.float64) / 30.0)).max() < 1e-5
    assert np.array_equal(got, -pinned.softcap32(-x, 30.0))
    noisy = np.random.default_rng(0).normal(0, 40, 10_000).astype(np.float32)
    assert np.array_equal(pinned.softcap32(noisy, 30.0, use_native=False),
                          pinned.softcap32(noisy, 30.0))  # numpy exp32 = the native one


def test_a_gguf_file_with_the_llama_cpp_keys_is_capped(capped, tmp_path) -> None:
    from gguf_family_helpers import write_family_gguf

    _, cfg, weights = capped

    def keys(writer) -> None:
        writer.add_float32("gemma3.attn_logit_softcapping", ATTN_CAP)
        writer.add_float32("gemma3.final_logit_softcapping", FINAL_CAP)

    path = write_family_gguf("gemma3-tiny", tmp_path / "capped.gguf", extra=keys)
    model = needlepoint.load(path, numerics="float")
    assert (model.config.attn_softcap, model.config.final_softcap) == (ATTN_CAP, FINAL_CAP)
    ids = prompt_ids()
    assert np.abs(model.forward(ids) - gemma3_reference(cfg, weights, ids)).max() < 1e-4


def test_a_gemma2_checkpoint_runs_with_its_default_caps(tmp_path) -> None:
    """Gemma 2: Gemma 3's block without q/k norms, one RoPE theta, every other layer
    sliding, both caps on by default (a config that leaves them out gets 50 and 30)."""
    source = hf_fixture_dir("gemma3-tiny")
    weights = {k: v for k, v in read_safetensors(source / "model.safetensors").items()
               if "q_norm" not in k and "k_norm" not in k}
    out = tmp_path / "gemma2-tiny"
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("reference.*", "*.safetensors"))
    write_safetensors(out / "model.safetensors", weights)
    base = json.loads((source / "config.json").read_text())
    cfg = {k: base[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "head_dim",
                                "max_position_embeddings", "rms_norm_eps", "vocab_size",
                                "bos_token_id", "eos_token_id", "pad_token_id")}
    cfg.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"], rope_theta=10000.0,
               query_pre_attn_scalar=32, sliding_window=16, attn_logit_softcapping=0.5)
    (out / "config.json").write_text(json.dumps(cfg))
    spec = spec_from_config(cfg)
    assert (spec.attn_softcap, spec.final_softcap, spec.qk_norm) == (0.5, 30.0, False)
    assert tuple(layer.window for layer in spec.layers) == (16, None, 16, None, 16, None)
    assert {layer.theta for layer in spec.layers} == {10000.0}
    expect_cfg = {**cfg, "final_logit_softcapping": 30.0,
                  "layer_types": ["sliding_attention", "full_attention"] * 3}
    ids = prompt_ids()
    expect = gemma3_reference(expect_cfg, weights, ids)
    got = needlepoint.load(out, numerics="float").forward(ids)
    assert np.abs(got - expect).max() < 1e-4
    off = spec_from_config({**cfg, "final_logit_softcapping": None})
    assert off.final_softcap is None  # an explicit null turns a default cap off


def test_int8_soft_capped_logits_have_the_same_bits_native_or_not(capped) -> None:
    """Fresh processes per variant (the native library is picked once per process)."""
    import hashlib
    import os
    import subprocess
    import sys

    folder = capped[0]
    ids = prompt_ids().tolist()
    code = ("import hashlib, sys, numpy as np, needlepoint\n"
            f"m = needlepoint.load({str(folder)!r}, numerics='int8')\n"
            f"print(hashlib.sha256(np.ascontiguousarray(m.forward({ids})).tobytes()).hexdigest())")
    digests = set()
    for variant in ({"NEEDLEPOINT_NATIVE": "0"}, {"NEEDLEPOINT_NATIVE_VARIANT": "0"}, {}):
        env = {**os.environ, **variant}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300, check=True).stdout.strip()
        digests.add(out)
    model = needlepoint.load(folder, numerics="int8")
    digests.add(hashlib.sha256(np.ascontiguousarray(model.forward(ids)).tobytes()).hexdigest())
    assert len(digests) == 1
