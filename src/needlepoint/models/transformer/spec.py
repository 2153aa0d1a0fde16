"""The block spec: every architectural choice of a decoder-only transformer, as data.

One `BlockSpec` drives the whole forward pass (`layers.py`, `attention.py`, `block.py`): which
norm, gated (SwiGLU) or plain MLP and its activation, RoPE or learned positions, how many kv
heads, fused or separate q/k/v, which projections carry biases, tied embeddings, per-head q/k
norms, Gemma's `1 + w` norms and its norms around the attention and MLP outputs, a scaled
embedding, logit soft-capping, and per layer (`LayerSpec`) a sliding window and a RoPE theta.
The maths never asks "is this Llama?"; `spec_from_config` is the one place that turns a
Hugging Face `config.json` (or the HF-style dict a GGUF file is translated to) into a spec,
through the architecture's file (`formats/arch/<name>.py`, found by `formats/arch/registry.py`).

Config fields: `shared/fixtures/hf/README.md`, "config.json fields that matter" and its second
part, "What differs from the Llama forward pass".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...errors import CheckpointError, UnsupportedArchitectureError
from ...formats.arch.registry import by_model_type

NORMS = ("rms", "layer")
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class LayerSpec:
    """What may differ between the layers of one model."""

    window: int | None  # sliding window (keys seen per query, itself included); None: full
    theta: float  # RoPE theta (0.0 without RoPE)


@dataclass(frozen=True)
class BlockSpec:
    """Geometry and choices of one model (also its `model.config`)."""

    architecture: str  # the family the tensor names follow ("llama", "gpt2")
    vocab: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    d_ff: int
    max_seq_len: int
    norm: str  # "rms": w * x / sqrt(mean(x^2) + eps); "layer": (x - mean) / sqrt(var + eps) * w + b
    norm_eps: float
    gated: bool  # True: down(act(gate(x)) * up(x)); False: proj(act(fc(x)))
    activation: str  # "silu" or "gelu_tanh"
    rope: bool  # rotary positions (HF half-split layout) on q and k
    rope_theta: float
    learned_positions: bool  # an absolute position table added to the embedding
    qkv_fused: bool  # one [d, (H + 2 Hkv) hd] projection split into q | k | v
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    norm_bias: bool
    tied_embeddings: bool  # logits = h embed^T
    attn_scale: float  # scores multiplier (1/sqrt(head_dim), or 1)
    scale_by_layer: bool  # scores also divided by layer index + 1 (GPT-2 option)
    bos_id: int | None = None
    eos_id: int | None = None
    qk_norm: bool = False  # an RMSNorm over each head's q and k, before RoPE (Qwen3, Gemma 3)
    output_norms: bool = False  # norms on the attention and MLP outputs (Gemma's four norms)
    norm_offset: float = 0.0  # the norm weight applied is `offset + w` (Gemma: 1)
    embed_scale: float | None = None  # embedding rows times float32(this) (Gemma: sqrt(d))
    layers: tuple[LayerSpec, ...] = ()  # one per layer (`num_layers` of them)
    # logit soft-capping `cap * tanh(x / cap)` (Gemma 2, some Gemma 3 exports; None: off)
    attn_softcap: float | None = None  # on the attention scores, before the mask and softmax
    final_softcap: float | None = None  # on the LM head's logits

    def __post_init__(self) -> None:
        if self.norm not in NORMS or self.activation not in ACTIVATIONS:
            raise UnsupportedArchitectureError(f"norm {self.norm!r} / activation "
                                               f"{self.activation!r} not supported")
        for name in ("vocab", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "d_ff", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise CheckpointError(f"config: {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"config: {self.num_heads} attention heads are not a multiple "
                                  f"of {self.num_kv_heads} kv heads")
        if self.rope and self.head_dim % 2:
            raise CheckpointError(f"config: RoPE needs an even head_dim, got {self.head_dim}")
        if len(self.layers) != self.num_layers:
            raise CheckpointError(f"config: {len(self.layers)} layer specs for "
                                  f"{self.num_layers} layers")
        for name in ("attn_softcap", "final_softcap"):
            cap = getattr(self, name)
            if cap is not None and not (isinstance(cap, float) and math.isfinite(cap)
                                        and cap > 0):
                raise CheckpointError(f"config: {name} must be a positive number, got {cap!r}")

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (keys seen per query, itself included), or None."""
        return self.layers[layer].window

    def theta(self, layer: int) -> float:
        """Layer `layer`'s RoPE theta."""
        return self.layers[layer].theta

    @property
    def vocab_size(self) -> int:
        return self.vocab

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per kv head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def with_layers(self, num_layers: int) -> BlockSpec:
        return replace(self, num_layers=num_layers, layers=self.layers[:num_layers])


def spec_from_config(config: dict[str, Any]) -> BlockSpec:
    """The spec of a Hugging Face `config.json` dict, read by its architecture's file; an
    unknown `model_type` is an UnsupportedArchitectureError."""
    fields = dict(by_model_type(config.get("model_type")).fields(config))
    fields["layers"] = tuple(LayerSpec(**layer) for layer in fields["layers"])
    return BlockSpec(**fields)


__all__ = ["BlockSpec", "LayerSpec", "spec_from_config"]
