"""The block spec: every architectural choice of a decoder-only transformer, as data.

One `BlockSpec` drives the whole forward pass (`layers.py`, `attention.py`, `block.py`): which
norm, gated (SwiGLU) or plain MLP and its activation, RoPE or learned positions, how many kv
heads, fused or separate q/k/v, which projections carry biases, tied embeddings; and the fields
of the Qwen / Gemma families (issue 28 item 1): per-head q/k norms, Gemma's `1 + w` norms and
its norms around the attention and MLP outputs, a scaled embedding, a sliding window and a RoPE
theta per layer. The maths never asks "is this Llama?"; `spec_from_config` is the one place that
reads a Hugging Face `config.json` (or the HF-style dict a GGUF file is translated to) and
decides the fields (`spec_families.py` for Qwen2, Qwen3 and Gemma 3).

Config fields: `shared/fixtures/hf/README.md`, "config.json fields that matter" and its second
part, "What differs from the Llama forward pass".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from ...errors import CheckpointError, UnsupportedArchitectureError
from .config_fields import (
    FAMILY_FIELDS,
    config_int,
    rope_theta_of,
    special_id,
    text_config,
)

ARCHITECTURES = ("llama", "gpt2", "qwen2", "qwen3", "gemma3_text", "gemma3")
NORMS = ("rms", "layer")
ACTIVATIONS = ("silu", "gelu_tanh")
_LLAMA_ACTS = {"silu": "silu", "swish": "silu"}
_GPT2_ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


# BlockSpec fields the fused native int8 block (`int8_fused.py`) computes for any value: the
# geometry, the pre-norm block's choices, the special ids, and what happens outside the
# blocks (the embedding scale, the final soft-cap). Any other field must be at its default
# for a block to be fused (`BlockSpec.plain`).
FUSED_ANY_VALUE = frozenset((
    "architecture", "vocab", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
    "d_ff", "max_seq_len", "norm", "norm_eps", "gated", "activation", "rope", "rope_theta",
    "learned_positions", "qkv_fused", "qkv_bias", "out_bias", "mlp_bias", "norm_bias",
    "tied_embeddings", "attn_scale", "scale_by_layer", "bos_id", "eos_id", "embed_scale",
    "final_softcap"))


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
    windows: tuple[int | None, ...] = ()  # per layer: sliding window, None = full (() all full)
    thetas: tuple[float, ...] = ()  # per layer RoPE theta (() = rope_theta everywhere)
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
        for name in ("windows", "thetas"):
            if getattr(self, name) and len(getattr(self, name)) != self.num_layers:
                raise CheckpointError(f"config: {name} needs one entry per layer")
        for name in ("attn_softcap", "final_softcap"):
            cap = getattr(self, name)
            if cap is not None and not (isinstance(cap, float) and math.isfinite(cap)
                                        and cap > 0):
                raise CheckpointError(f"config: {name} must be a positive number, got {cap!r}")

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (keys seen per query, itself included), or None."""
        return self.windows[layer] if self.windows else None

    def theta(self, layer: int) -> float:
        """Layer `layer`'s RoPE theta."""
        return self.thetas[layer] if self.thetas else self.rope_theta

    @property
    def plain(self) -> bool:
        """Whether the fused native int8 block computes this block: an allow-list, so a
        feature added to the spec runs the Python block until the kernel is taught it. Every
        field not in `FUSED_ANY_VALUE` must be at its default, except windows that are all
        full and one RoPE theta repeated per layer (the same block as none)."""
        for item in fields(self):
            if item.name in FUSED_ANY_VALUE:
                continue
            value = getattr(self, item.name)
            if item.name == "windows":
                value = () if all(w is None for w in value) else value
            elif item.name == "thetas":
                value = () if len(set(value)) <= 1 else value
            if value != item.default:
                return False
        return True

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
        return replace(self, num_layers=num_layers, windows=self.windows[:num_layers],
                       thetas=self.thetas[:num_layers])


def _activation(config: dict[str, Any], key: str, default: str, known: dict[str, str],
                architecture: str) -> str:
    """The config's activation (`key`, else `default`) as ours, else a typed refusal."""
    act = known.get(config.get(key, default))
    if act is None:
        raise UnsupportedArchitectureError(
            f"config.json: {key} {config.get(key)!r} is not supported for {architecture}")
    return act


def _llama(config: dict[str, Any]) -> BlockSpec:
    d = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    act = _activation(config, "hidden_act", "silu", _LLAMA_ACTS, "llama")
    head_dim = config_int(config, "head_dim", d // heads)
    attention_bias = bool(config.get("attention_bias", False))
    return BlockSpec(
        architecture="llama", vocab=config_int(config, "vocab_size"), d_model=d,
        num_layers=config_int(config, "num_hidden_layers"), num_heads=heads,
        num_kv_heads=config_int(config, "num_key_value_heads", heads), head_dim=head_dim,
        d_ff=config_int(config, "intermediate_size"),
        max_seq_len=config_int(config, "max_position_embeddings", 2048),
        norm="rms", norm_eps=float(config.get("rms_norm_eps", 1e-6)), gated=True,
        activation=act, rope=True, rope_theta=rope_theta_of(config), learned_positions=False,
        qkv_fused=False, qkv_bias=attention_bias, out_bias=attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)), norm_bias=False,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attn_scale=1.0 / math.sqrt(head_dim), scale_by_layer=False,
        bos_id=special_id(config, "bos_token_id"), eos_id=special_id(config, "eos_token_id"),
    )


def _gpt2(config: dict[str, Any]) -> BlockSpec:
    d = config_int(config, "n_embd")
    heads = config_int(config, "n_head")
    act = _activation(config, "activation_function", "gelu_new", _GPT2_ACTS,
                      "gpt2 (gelu_new)")
    if d % heads:
        raise CheckpointError(f"config.json: n_embd {d} is not a multiple of n_head {heads}")
    head_dim = d // heads
    return BlockSpec(
        architecture="gpt2", vocab=config_int(config, "vocab_size"), d_model=d,
        num_layers=config_int(config, "n_layer"), num_heads=heads, num_kv_heads=heads,
        head_dim=head_dim, d_ff=config_int(config, "n_inner", 4 * d),
        max_seq_len=config_int(config, "n_positions", 1024),
        norm="layer", norm_eps=float(config.get("layer_norm_epsilon", 1e-5)), gated=False,
        activation=act, rope=False, rope_theta=0.0, learned_positions=True, qkv_fused=True,
        qkv_bias=True, out_bias=True, mlp_bias=True, norm_bias=True,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        attn_scale=1.0 / math.sqrt(head_dim) if config.get("scale_attn_weights", True) else 1.0,
        scale_by_layer=bool(config.get("scale_attn_by_inverse_layer_idx", False)),
        bos_id=special_id(config, "bos_token_id"), eos_id=special_id(config, "eos_token_id"),
    )


def spec_from_config(config: dict[str, Any]) -> BlockSpec:
    """The spec of a Hugging Face `config.json` dict; unknown `model_type` is an
    UnsupportedArchitectureError."""
    config = text_config(config)
    kind = config.get("model_type")
    if kind in FAMILY_FIELDS:
        return BlockSpec(**FAMILY_FIELDS[kind](config))
    builder = {"llama": _llama, "gpt2": _gpt2}.get(kind)
    if builder is None:
        raise UnsupportedArchitectureError(
            f"config.json: model_type {kind!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    return builder(config)


__all__ = ["ARCHITECTURES", "BlockSpec", "rope_theta_of", "spec_from_config"]
