"""GPT-2: LayerNorm with biases, plain gelu-tanh MLP, learned absolute positions, one fused
q|k|v projection, Conv1D weights stored `[in, out]`.

Honoured: `n_embd`, `n_head`, `n_layer`, `n_inner`, `n_positions`, `layer_norm_epsilon`,
`activation_function` (gelu_new / gelu_pytorch_tanh), `scale_attn_weights`,
`scale_attn_by_inverse_layer_idx`, `tie_word_embeddings`, the special ids. Refused by name:
other activations, `n_embd` not a multiple of `n_head`. Tensor names with or without the
`transformer.` prefix (GPT2LMHeadModel / GPT2Model). GGUF `gpt2`: the linear weights stored
`[out, in]`, transposed back when read.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import CheckpointError
from .base import REQUIRED, Architecture, GGUFForm, Meta, TensorMap, names_from_map
from .common import activation, config_int, decimal, public, special_id

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

TENSORS = TensorMap({
    "token_embd": "transformer.wte", "position_embd": "transformer.wpe",
    "output_norm": "transformer.ln_f", "output": "lm_head",
    "blk.{i}.attn_norm": "transformer.h.{i}.ln_1",
    "blk.{i}.attn_qkv": "transformer.h.{i}.attn.c_attn",
    "blk.{i}.attn_output": "transformer.h.{i}.attn.c_proj",
    "blk.{i}.ffn_norm": "transformer.h.{i}.ln_2",
    "blk.{i}.ffn_up": "transformer.h.{i}.mlp.c_fc",
    "blk.{i}.ffn_down": "transformer.h.{i}.mlp.c_proj",
})
# GPT2LMHeadModel's names; GPT2Model's lack the `transformer.` prefix
NAMES = names_from_map(TENSORS, in_out=True, prefixes=("transformer.", ""))


def fields(config: dict[str, Any]) -> dict[str, Any]:
    d = config_int(config, "n_embd")
    heads = config_int(config, "n_head")
    act = activation(config, "activation_function", "gelu_new", ACTIVATIONS)
    if d % heads:
        raise CheckpointError(f"config.json: n_embd {d} is not a multiple of n_head {heads}")
    head_dim = d // heads
    layers = config_int(config, "n_layer")
    return dict(
        architecture="gpt2", vocab=config_int(config, "vocab_size"), d_model=d,
        num_layers=layers, num_heads=heads, num_kv_heads=heads,
        head_dim=head_dim, d_ff=config_int(config, "n_inner", 4 * d),
        max_seq_len=config_int(config, "n_positions", 1024),
        norm="layer", norm_eps=float(config.get("layer_norm_epsilon", 1e-5)), gated=False,
        activation=act, rope=False, rope_theta=0.0, learned_positions=True, qkv_fused=True,
        qkv_bias=True, out_bias=True, mlp_bias=True, norm_bias=True,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        attn_scale=1.0 / math.sqrt(head_dim) if config.get("scale_attn_weights", True) else 1.0,
        scale_by_layer=bool(config.get("scale_attn_by_inverse_layer_idx", False)),
        bos_id=special_id(config, "bos_token_id"), eos_id=special_id(config, "eos_token_id"),
        layers=tuple({"window": None, "theta": 0.0} for _ in range(layers)))


def gguf_config(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
    d, heads = int(meta("embedding_length", REQUIRED)), int(meta("attention.head_count", REQUIRED))
    return {"model_type": "gpt2", "n_embd": d, "n_head": heads,
            "n_layer": int(meta("block_count", REQUIRED)),
            "n_inner": int(meta("feed_forward_length", REQUIRED)),
            "n_positions": int(meta("context_length", REQUIRED)),
            "layer_norm_epsilon": decimal(meta("attention.layer_norm_epsilon", 1e-5)),
            "activation_function": "gelu_new", **public(common)}


ARCH = Architecture(
    name="gpt2", model_types=("gpt2",), fields=fields, names=NAMES,
    gguf=GGUFForm("gpt2", TENSORS, gguf_config,
                  transposed=("attn_qkv", "attn_output", "ffn_up", "ffn_down")),
    doc=__doc__ or "")
