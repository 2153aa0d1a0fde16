"""The GGUF files of `needlepoint-bench-hf-shapes` (issue 28 item 5): random weights in the
geometry of Qwen3-0.6B and Gemma 3 270M, a synthetic tokenizer of the real vocabulary size,
written by `needlepoint.write_gguf` (gguf's `GGUFWriter`, llama.cpp's layout) as Q8_0 and as a
Q4_K_M-style mix.

Geometry: the published `config.json` of each model (Qwen/Qwen3-0.6B: hidden 1024, 28 layers,
16 q / 8 kv heads, head_dim 128, intermediate 3072, vocab 151936, tied embeddings, q/k norms,
RoPE 1e6; google/gemma-3-270m: hidden 640, 18 layers, 4 q / 1 kv head, head_dim 256,
intermediate 2048, vocab 262144, sliding window 512 with 5 sliding : 1 full,
`query_pre_attn_scalar` 256, RoPE 1e6 full / 1e4 sliding; the GGUF metadata of published
gemma3:270m files agrees). `TINY` holds small geometries of the same families (the smoke test).

Q4_K_M (`q4_k_m_type`): llama.cpp's `llama_tensor_get_type` for `LLAMA_FTYPE_MOSTLY_Q4_K_M`,
its main rules: the tied embedding (the output) Q6_K; `attn_v` and `ffn_down` Q6_K in the
layers `use_more_bits` picks (the first and last eighth, every third between), else Q4_K;
everything else Q4_K; a matrix whose rows are not a multiple of 256 falls back as llama.cpp
does (Q4_K -> Q5_0, Q6_K -> Q8_0): Gemma's 640-wide rows.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import needlepoint

QWEN3_0_6B = {"arch": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 40960,
              "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000.0,
                                                         "rope_type": "default"}}
GEMMA3_270M = {"arch": "gemma3", "hidden_size": 640, "num_hidden_layers": 18,
               "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
               "intermediate_size": 2048, "vocab_size": 262144, "max_position_embeddings": 32768,
               "rms_norm_eps": 1e-6, "sliding_window": 512, "query_pre_attn_scalar": 256,
               "rope_parameters": {"full_attention": {"rope_theta": 1000000.0},
                                   "sliding_attention": {"rope_theta": 10000.0}}}
MODELS = {"qwen3-0.6b": QWEN3_0_6B, "gemma3-270m": GEMMA3_270M}
TINY = {"qwen3-tiny": dict(QWEN3_0_6B, hidden_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                           intermediate_size=512, vocab_size=2048),
        "gemma3-tiny": dict(GEMMA3_270M, hidden_size=128, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                            intermediate_size=256, vocab_size=2048, sliding_window=32,
                            query_pre_attn_scalar=64)}
QUANTS = ("Q8_0", "Q4_K_M")
SCALE = 0.02  # weights ~ N(0, SCALE): the usual initialisation; activations stay in range


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet (bytes_to_unicode): the 256 one-byte tokens of a BPE vocab."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in keep]
    table = dict(zip(keep, keep, strict=True)) | {b: 256 + i for i, b in enumerate(extra)}
    return [chr(table[b]) for b in range(256)]


def qwen_vocab(size: int) -> needlepoint.GgufVocab:
    """A byte-level BPE vocabulary of `size` tokens: the 256 bytes, then pair merges (every
    two-byte token, then three-byte ones) so each merge makes a token of the list, then
    Qwen's three control tokens at the end (eos `<|im_end|>`, pad `<|endoftext|>`)."""
    chars = _byte_chars()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens, merges = list(chars), []
    pairs = ((a, b) for a in chars for b in chars)
    triples = ((a + b, c) for a in chars for b in chars for c in chars)
    for left, right in itertools.chain(pairs, triples):  # triples' left halves: pairs
        if len(tokens) >= size - len(special):
            break
        tokens.append(left + right)
        merges.append(f"{left} {right}")
    tokens += special
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    return needlepoint.GgufVocab("gpt2", tokens, types, merges=merges, pre="qwen2",
                                 special={"eos": size - 1, "pad": size - 3})


def gemma_vocab(size: int) -> needlepoint.GgufVocab:
    """A SentencePiece-style vocabulary of `size` tokens: `<pad> <eos> <bos> <unk>`, the 256
    byte tokens `<0x00>`.., then distinct letter pieces (every other one word-initial `▁`),
    scores falling with the id."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 2] + [6] * 256
    k = 0
    while len(tokens) < size:
        piece, n = "", k
        while n >= 0:  # k in bijective base 26: a .. z, aa, ab, ...
            piece, n = chr(97 + n % 26) + piece, n // 26 - 1
        tokens += [piece, "▁" + piece]
        types += [1, 1]
        k += 1
    return needlepoint.GgufVocab("llama", tokens[:size], types[:size],
                                 scores=[-float(i) for i in range(size)],
                                 add_space_prefix=False, add_bos=True,
                                 special={"bos": 2, "eos": 1, "unk": 3, "pad": 0})


def _shapes(geometry: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    h, q = geometry["hidden_size"], geometry["num_attention_heads"] * geometry["head_dim"]
    kv, f = geometry["num_key_value_heads"] * geometry["head_dim"], geometry["intermediate_size"]
    gemma = geometry["arch"] == "gemma3"
    yield "model.embed_tokens.weight", (geometry["vocab_size"], h)
    for i in range(geometry["num_hidden_layers"]):
        p = f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"] + (
            ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if gemma else [])
        yield from ((p + n + ".weight", (h,)) for n in norms)
        yield p + "self_attn.q_norm.weight", (geometry["head_dim"],)
        yield p + "self_attn.k_norm.weight", (geometry["head_dim"],)
        yield from ((p + n, s) for n, s in (
            ("self_attn.q_proj.weight", (q, h)), ("self_attn.k_proj.weight", (kv, h)),
            ("self_attn.v_proj.weight", (kv, h)), ("self_attn.o_proj.weight", (h, q)),
            ("mlp.gate_proj.weight", (f, h)), ("mlp.up_proj.weight", (f, h)),
            ("mlp.down_proj.weight", (h, f))))
    yield "model.norm.weight", (h,)


def random_tensors(geometry: dict, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """The model's tensors (Hugging Face names), made one at a time: matrices ~ N(0, SCALE),
    norms 1 (Gemma's `(1 + w)` norms: w = 0)."""
    rng = np.random.default_rng(seed)
    norm = 0.0 if geometry["arch"] == "gemma3" else 1.0
    for name, shape in _shapes(geometry):
        if len(shape) == 1:
            yield name, np.full(shape, norm, np.float32)
        else:
            yield name, rng.standard_normal(shape, dtype=np.float32) * np.float32(SCALE)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(layers: int):
    """llama.cpp's Q4_K_M choice per weight (module doc), for a model of `layers` layers."""
    def choose(name: str, shape: tuple[int, int]) -> str:
        if name == "model.embed_tokens.weight":
            kind = "Q6_K"
        elif name.endswith(("v_proj.weight", "down_proj.weight")):
            kind = "Q6_K" if _use_more_bits(int(name.split(".")[2]), layers) else "Q4_K"
        else:
            kind = "Q4_K"
        if shape[1] % 256:
            kind = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]
        return kind
    return choose


def hf_config(geometry: dict) -> dict:
    """The `config.json` fields `write_gguf` reads (plus the Gemma fields it leaves out, as
    llama.cpp's converter does)."""
    return {k: v for k, v in geometry.items() if k != "arch"}


def write_model(name: str, quant: str, folder: Path, seed: int = 0) -> Path:
    """`folder/{name}-{quant}.gguf`, written once (a later run reuses it; written to a
    temporary name first, so an interrupted write is never taken for a file)."""
    geometry = {**MODELS, **TINY}[name]
    out = folder / f"{name}-{quant}-seed{seed}.gguf"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    vocab = (gemma_vocab if geometry["arch"] == "gemma3" else qwen_vocab)(geometry["vocab_size"])
    qtype = q4_k_m_type(geometry["num_hidden_layers"]) if quant == "Q4_K_M" else quant
    part = out.with_suffix(f".part{os.getpid()}")
    needlepoint.write_gguf(part, geometry["arch"], hf_config(geometry),
                           random_tensors(geometry, seed), vocab, qtype)
    part.rename(out)
    return out
