"""Llama (and SmolLM, TinyLlama, ...): RMSNorm, SwiGLU, RoPE, grouped kv heads.

Honoured: `hidden_size`, `num_attention_heads`, `num_key_value_heads`, `head_dim`,
`intermediate_size`, `num_hidden_layers`, `max_position_embeddings`, `rms_norm_eps`,
`hidden_act` (silu), `rope_theta` / `rope_parameters` (plain RoPE), `attention_bias`,
`mlp_bias`, `tie_word_embeddings`, the special ids. Refused by name: RoPE scaling, partial
rotary embeddings, any other activation. GGUF `llama`: llama.cpp's converter permutes the q/k
rows into interleaved RoPE pairs (`LlamaModel.modify_tensors`), undone when read.
"""

from __future__ import annotations

import math
from typing import Any

from .base import Architecture, GGUFForm, Meta, TensorMap, names_from_map
from .common import (
    SILU,
    activation,
    config_int,
    decoder_fields,
    gguf_decoder,
    per_layer,
    plain_rope,
    rope_theta_of,
)

# llama.cpp's tensor names (gguf.constants.TENSOR_NAMES) -> Hugging Face's
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                  "output": "lm_head"}
LAYER_TENSORS = {
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}
TENSORS = TensorMap({**GLOBAL_TENSORS, **LAYER_TENSORS})
NAMES = names_from_map(TENSORS, in_out=False)


def fields(config: dict[str, Any]) -> dict[str, Any]:
    d = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    act = activation(config, "hidden_act", "silu", SILU)
    head_dim = config_int(config, "head_dim", d // heads)
    bias = bool(config.get("attention_bias", False))
    theta = rope_theta_of(config)
    layers = config_int(config, "num_hidden_layers")
    return dict(
        decoder_fields(config, "llama", d, heads, head_dim),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)), activation=act, rope_theta=theta,
        qkv_bias=bias, out_bias=bias, mlp_bias=bool(config.get("mlp_bias", False)),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attn_scale=1.0 / math.sqrt(head_dim),
        layers=per_layer((None,) * layers, (theta,) * layers))


def gguf_config(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
    plain_rope(common["_path"], meta)
    return {**gguf_decoder(meta, common, "llama"),
            "rope_theta": float(meta("rope.freq_base", 10000.0)), "hidden_act": "silu",
            "attention_bias": common["_has"]("model.layers.0.self_attn.q_proj.bias"),
            "mlp_bias": common["_has"]("model.layers.0.mlp.gate_proj.bias")}


ARCH = Architecture(
    name="llama", model_types=("llama",), fields=fields, names=NAMES,
    gguf=GGUFForm("llama", TENSORS, gguf_config, permuted_qk=True), doc=__doc__ or "")
