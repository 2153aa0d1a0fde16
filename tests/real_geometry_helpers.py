"""Small random-weight GGUFs in the geometry of the two real files the project targets
(Qwen2.5-Coder-0.5B `qwen2`, Gemma 3 270M `gemma3`): their widths, head counts and head
widths, Qwen's q/k/v biases, Gemma's q/k norms, output norms and 5:1 sliding/full pattern,
but few layers, a short context, a small sliding window and the fixtures' tokenizers.

The 2-D weights together hold every integer ggml type of `kernels.wtypes` and one F16
matrix per model (quantised to int8 at load): the 32-value types (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, IQ4_NL) rotate over q / k / v / o / gate / up layer by layer, the K-quants (Q2_K ..
Q6_K, 256-value blocks) take the matrices whose rows are multiples of 256 (`ffn_down`,
Gemma's `attn_output`). Every block is random bytes whose float16 scales are set so the
matrix is centred and has a realistic spread (about 1 / sqrt(inputs) per value, measured
with `gguf.quants.dequantize`, not with the code under test): a random network whose
activations stay of order one, like a trained one's.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf_family_helpers import fixture_vocab
from hf_helpers import hf_fixture_dir
from wtype_helpers import HALF_AT

from needlepoint.formats.gguf_write import write_gguf

SMALL = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL")  # blocks of 32 values
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # blocks of 256 values
SLOTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")

# the real files' geometry (module doc); context and window shortened for the tests
QWEN = {"arch": "qwen2", "fixture": "qwen2-tiny", "layers": 5, "d": 896, "heads": 14,
        "kv_heads": 2, "head_dim": 64, "ff": 4864, "context": 256}
GEMMA = {"arch": "gemma3", "fixture": "gemma3-tiny", "layers": 6, "d": 640, "heads": 4,
         "kv_heads": 1, "head_dim": 256, "ff": 2048, "context": 256, "window": 8}


def qwen_types(layer: int) -> dict[str, str]:
    """Qwen: q, k, v, o, gate, up take the six 32-value types, shifted by one per layer;
    `ffn_down` (rows of 4864 = 19 * 256) a K-quant per layer; layer 3's `attn_k` F16."""
    types = {slot: SMALL[(layer + j) % len(SMALL)] for j, slot in enumerate(SLOTS)}
    types["ffn_down"] = K_QUANTS[layer % len(K_QUANTS)]
    if layer == 3:
        types["attn_k"] = "F16"
    return types


def gemma_types(layer: int) -> dict[str, str]:
    """Gemma: q, k, v, gate, up the 32-value types; `attn_output` (rows of 1024) and
    `ffn_down` (rows of 2048) K-quants; layer 2's `ffn_gate` F16."""
    types = {slot: SMALL[(layer + j) % len(SMALL)] for j, slot in enumerate(SLOTS)}
    types["attn_output"] = K_QUANTS[layer % len(K_QUANTS)]
    types["ffn_down"] = K_QUANTS[(layer + 2) % len(K_QUANTS)]
    if layer == 2:
        types["ffn_gate"] = "F16"
    return types


# the mean code of the types whose second float16 is an offset, and the offset's sign:
# Q4_1 / Q5_1 add `m`, the K-quants subtract `dmin` times a sub-block code
OFFSET = {"Q4_1": (7.5, -1.0), "Q5_1": (15.5, -1.0), "Q2_K": (1.5, 1.0), "Q4_K": (7.5, 1.0),
          "Q5_K": (15.5, 1.0)}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row bytes] of random `kind` blocks: random codes and sub-block scales; d
    of either sign, and an offset (m, dmin) that centres the values (a trained matrix's
    values have mean ~0; uncentred ones would make some outputs cancel, which Gemma's
    post-ffw norm then blows up), all rescaled so the dequantised values have a standard
    deviation of about 1 / sqrt(cols)."""
    qtype = gguf.GGMLQuantizationType[kind]
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block_values * block_bytes), dtype=np.uint8)
    blocks = data.reshape(-1, block_bytes)
    d = rng.uniform(0.5, 1.0, blocks.shape[0]) * rng.choice([-1.0, 1.0], blocks.shape[0])
    halves = [d]
    if kind in OFFSET:
        mean_code, sign = OFFSET[kind]
        halves.append(sign * mean_code * d)

    def store(factor: float) -> None:
        for at, value in zip(HALF_AT[kind], halves, strict=True):
            half = (value * factor).astype(np.float16)
            assert np.isfinite(half).all() and (half != 0).all()
            blocks[:, at : at + 2] = half.reshape(-1, 1).view(np.uint8)

    store(1.0)
    sample = gguf.quants.dequantize(data[:8], qtype)
    store(1.0 / (np.sqrt(cols) * float(np.std(sample))))
    return data


def _matrix(rows: int, cols: int, kind: str, rng: np.random.Generator
            ) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """A 2-D tensor [rows, cols] as `GGUFWriter.add_tensor` takes it (raw blocks + type)."""
    if kind == "F16":
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16), None
    return random_blocks(kind, rows, cols, rng), gguf.GGMLQuantizationType[kind]


def _config(g: dict) -> dict:
    """The Hugging Face config fields `write_gguf` turns into the `{arch}.*` metadata."""
    config = {"max_position_embeddings": g["context"], "hidden_size": g["d"],
              "num_hidden_layers": g["layers"], "intermediate_size": g["ff"],
              "num_attention_heads": g["heads"], "num_key_value_heads": g["kv_heads"],
              "rms_norm_eps": 1e-6}
    if g["arch"] == "gemma3":
        config.update(head_dim=g["head_dim"], sliding_window=g["window"], rope_parameters={
            "full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}})
    else:
        config["rope_parameters"] = {"rope_theta": 1e6}
    return config


def write_real_geometry_gguf(g: dict, out: Path, seed: int = 0) -> tuple[Path, dict]:
    """Write the model `g` (QWEN or GEMMA) to `out`; returns the path and the type of every
    2-D tensor by GGUF name."""
    arch, rng = g["arch"], np.random.default_rng(seed)
    vocab = fixture_vocab(hf_fixture_dir(g["fixture"]), arch)
    d, q, kv, ff = g["d"], g["heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"], g["ff"]
    shapes = {"attn_q": (q, d), "attn_k": (kv, d), "attn_v": (kv, d), "attn_output": (d, q),
              "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
    pick = gemma_types if arch == "gemma3" else qwen_types
    types = {"token_embd.weight": "Q8_0" if arch == "gemma3" else "Q5_0"}
    if arch == "qwen2":
        types["output.weight"] = "Q8_0"  # untied, as in the real file
    for i in range(g["layers"]):
        types.update({f"blk.{i}.{slot}.weight": kind for slot, kind in pick(i).items()})
    # norms: weights near 1 (Gemma stores 1 + w, |w| <= 0.5)
    norms = ["output_norm"] + [f"blk.{i}.{n}" for i in range(g["layers"]) for n in (
        ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm") if arch == "gemma3"
        else ("attn_norm", "ffn_norm"))]

    def tensors(writer) -> None:
        for name, kind in types.items():
            if name.startswith("blk."):
                rows, cols = shapes[name.split(".")[2]]
            else:
                rows, cols = len(vocab.tokens), d
            value, raw = _matrix(rows, cols, kind, rng)
            writer.add_tensor(name, value, raw_dtype=raw)
        for name in norms:
            writer.add_tensor(f"{name}.weight", rng.uniform(0.5, 1.5, d).astype(np.float32))
        for i in range(g["layers"]):
            if arch == "gemma3":
                for n in ("attn_q_norm", "attn_k_norm"):
                    writer.add_tensor(f"blk.{i}.{n}.weight",
                                      rng.uniform(0.5, 1.5, g["head_dim"]).astype(np.float32))
            else:
                for n, width in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                    writer.add_tensor(f"blk.{i}.{n}.bias",
                                      (0.1 * rng.standard_normal(width)).astype(np.float32))

    return write_gguf(out, arch, _config(g), [], vocab, extra=tensors), types
