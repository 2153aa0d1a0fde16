"""The block spec: every architectural choice of a decoder-only transformer, as data.

One `BlockSpec` drives the whole forward pass (`layers.py`, `attention.py`, `block.py`): which
norm, gated (SwiGLU) or plain MLP and its activation, RoPE or learned positions, how many kv
heads, fused or separate q/k/v, which projections carry biases, tied embeddings. The maths never
asks "is this Llama?"; `spec_from_config` is the one place that reads a Hugging Face
`config.json` (or the HF-style dict a GGUF file is translated to) and decides the fields.

Config fields: `shared/fixtures/hf/README.md`, "config.json fields that matter".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...errors import CheckpointError, UnsupportedArchitectureError

ARCHITECTURES = ("llama", "gpt2")
NORMS = ("rms", "layer")
ACTIVATIONS = ("silu", "gelu_tanh")
_LLAMA_ACTS = {"silu": "silu", "swish": "silu"}
_GPT2_ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


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
        return replace(self, num_layers=num_layers)


def _int(config: dict[str, Any], key: str, default: Any = None) -> int:
    value = config.get(key)
    value = default if value is None else value
    if value is None:
        raise CheckpointError(f"config.json: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise CheckpointError(f"config.json: {key} must be an integer, got {value!r}")
    return int(value)


def _special_id(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


def rope_theta_of(config: dict[str, Any]) -> float:
    """`rope_parameters.rope_theta` (transformers 5) or top-level `rope_theta`; plain RoPE only
    (`rope_type`/`rope_scaling` absent, null or "default")."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    kind = None
    theta = config.get("rope_theta")
    if isinstance(params, dict):
        kind = params.get("rope_type", params.get("type"))
        theta = params.get("rope_theta", theta)
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type", kind))
    if kind not in (None, "default"):
        raise UnsupportedArchitectureError(f"config.json: RoPE type {kind!r} is not supported "
                                           f"(only plain RoPE)")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedArchitectureError("config.json: partial rotary embeddings are not "
                                           "supported")
    theta = 10000.0 if theta is None else theta
    if not isinstance(theta, int | float) or theta <= 0:
        raise CheckpointError(f"config.json: rope_theta must be positive, got {theta!r}")
    return float(theta)


def _llama(config: dict[str, Any]) -> BlockSpec:
    d = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    act = _LLAMA_ACTS.get(config.get("hidden_act", "silu"))
    if act is None:
        raise UnsupportedArchitectureError(
            f"config.json: hidden_act {config.get('hidden_act')!r} is not supported for llama")
    head_dim = _int(config, "head_dim", d // heads)
    attention_bias = bool(config.get("attention_bias", False))
    return BlockSpec(
        architecture="llama", vocab=_int(config, "vocab_size"), d_model=d,
        num_layers=_int(config, "num_hidden_layers"), num_heads=heads,
        num_kv_heads=_int(config, "num_key_value_heads", heads), head_dim=head_dim,
        d_ff=_int(config, "intermediate_size"),
        max_seq_len=_int(config, "max_position_embeddings", 2048),
        norm="rms", norm_eps=float(config.get("rms_norm_eps", 1e-6)), gated=True,
        activation=act, rope=True, rope_theta=rope_theta_of(config), learned_positions=False,
        qkv_fused=False, qkv_bias=attention_bias, out_bias=attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)), norm_bias=False,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attn_scale=1.0 / math.sqrt(head_dim), scale_by_layer=False,
        bos_id=_special_id(config, "bos_token_id"), eos_id=_special_id(config, "eos_token_id"),
    )


def _gpt2(config: dict[str, Any]) -> BlockSpec:
    d = _int(config, "n_embd")
    heads = _int(config, "n_head")
    act = _GPT2_ACTS.get(config.get("activation_function", "gelu_new"))
    if act is None:
        raise UnsupportedArchitectureError(
            f"config.json: activation_function {config.get('activation_function')!r} is not "
            f"supported for gpt2 (gelu_new)")
    if d % heads:
        raise CheckpointError(f"config.json: n_embd {d} is not a multiple of n_head {heads}")
    head_dim = d // heads
    return BlockSpec(
        architecture="gpt2", vocab=_int(config, "vocab_size"), d_model=d,
        num_layers=_int(config, "n_layer"), num_heads=heads, num_kv_heads=heads,
        head_dim=head_dim, d_ff=_int(config, "n_inner", 4 * d),
        max_seq_len=_int(config, "n_positions", 1024),
        norm="layer", norm_eps=float(config.get("layer_norm_epsilon", 1e-5)), gated=False,
        activation=act, rope=False, rope_theta=0.0, learned_positions=True, qkv_fused=True,
        qkv_bias=True, out_bias=True, mlp_bias=True, norm_bias=True,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        attn_scale=1.0 / math.sqrt(head_dim) if config.get("scale_attn_weights", True) else 1.0,
        scale_by_layer=bool(config.get("scale_attn_by_inverse_layer_idx", False)),
        bos_id=_special_id(config, "bos_token_id"), eos_id=_special_id(config, "eos_token_id"),
    )


_BUILDERS = {"llama": _llama, "gpt2": _gpt2}


def spec_from_config(config: dict[str, Any]) -> BlockSpec:
    """The spec of a Hugging Face `config.json` dict; unknown `model_type` is an
    UnsupportedArchitectureError."""
    kind = config.get("model_type")
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise UnsupportedArchitectureError(
            f"config.json: model_type {kind!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    return builder(config)
