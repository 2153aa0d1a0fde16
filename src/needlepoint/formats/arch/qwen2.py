"""Qwen2 / Qwen2.5 and their fine-tunes: Llama with q, k, v biases and optional sliding windows.

Honoured: Llama's fields, plus `use_sliding_window`, `sliding_window`, `max_window_layers` and
`layer_types` (a sliding window where `layer_types` says "sliding_attention", or, without
`layer_types`, from layer `max_window_layers` on when `use_sliding_window`, as transformers'
Qwen configs derive it). Refused by name: RoPE scaling, partial rotary embeddings, unknown
layer types, other activations. GGUF `qwen2`: stored as Hugging Face does (no q/k permutation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import Architecture, GGUFForm, Meta
from .common import (
    SILU,
    activation,
    config_int,
    decimal,
    decoder_fields,
    gguf_decoder,
    layer_windows,
    per_layer,
    plain_rope,
    rope_theta_of,
    write_decoder,
)
from .llama import NAMES, TENSORS


def qwen_fields(config: dict[str, Any], name: str, qk_norm: bool) -> dict[str, Any]:
    """Qwen2 (q, k, v biases) or Qwen3 (`qk_norm`: per-head q/k RMSNorm before RoPE, biases
    as `attention_bias` says)."""
    d = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    head_dim = config_int(config, "head_dim", d // heads)
    layers = config_int(config, "num_hidden_layers")
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    start = config_int(config, "max_window_layers", layers)
    derived = ["sliding_attention" if window is not None and i >= start else "full_attention"
               for i in range(layers)]
    bias = bool(config.get("attention_bias", False))
    theta = rope_theta_of(config)
    return dict(
        decoder_fields(config, name, d, heads, head_dim),
        norm_eps=float(config.get("rms_norm_eps") or 1e-6), mlp_bias=False,
        activation=activation(config, "hidden_act", "silu", SILU),
        rope_theta=theta, qkv_bias=bias if qk_norm else True,
        out_bias=bias if qk_norm else False,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attn_scale=1.0 / math.sqrt(head_dim), qk_norm=qk_norm,
        layers=per_layer(layer_windows(config, layers, window, derived), (theta,) * layers))


def gguf_qwen_config(meta: Meta, common: dict[str, Any], model_type: str) -> dict[str, Any]:
    plain_rope(common["_path"], meta)
    out = {**gguf_decoder(meta, common, model_type), "hidden_act": "silu",
           "rope_parameters": {"rope_theta": decimal(meta("rope.freq_base", 1e6)),
                               "rope_type": "default"},
           "use_sliding_window": False, "sliding_window": None}
    out["layer_types"] = ["full_attention"] * out["num_hidden_layers"]
    return out


def write_qwen(writer: Any, config: Mapping[str, Any]) -> None:
    write_decoder(writer, config)
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])


ARCH = Architecture(
    name="qwen2", model_types=("qwen2",), fields=lambda c: qwen_fields(c, "qwen2", False),
    names=NAMES,
    gguf=GGUFForm("qwen2", TENSORS, lambda m, c: gguf_qwen_config(m, c, "qwen2"), write_qwen),
    doc=__doc__ or "")
