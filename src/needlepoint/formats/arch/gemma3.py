"""Gemma 3 (its text model): scaled embedding, `1 + w` RMSNorms (four per layer and per-head
q/k), sliding and full layers each with its own RoPE theta, `query_pre_attn_scalar`,
gelu-tanh, tied embeddings, logit soft-capping where the config sets it.

Honoured: `model_type` "gemma3_text", or "gemma3" (a multimodal config: its `text_config`,
special ids and tied embeddings from the outer config when the text config leaves them out;
the vision tower is not read); Gemma3TextConfig's defaults for fields left out; `layer_types`,
`sliding_window`, `sliding_window_pattern`, `rope_parameters` per layer type (transformers 5)
or `rope_theta` + `rope_local_base_freq`, `query_pre_attn_scalar`, `hidden_activation`,
`attention_bias`, `attn_logit_softcapping`, `final_logit_softcapping`. Refused by name:
`use_bidirectional_attention`, RoPE scaling, partial rotary embeddings.

GGUF `gemma3` follows llama.cpp's `llama-model.cpp`, which stores neither the layer pattern,
the sliding layers' RoPE base nor `query_pre_attn_scalar`: the pattern is 5 sliding layers then
one full (`set_swa_pattern(6)`, or `attention.sliding_window_pattern` when present), sliding
layers use base 10000 (or `rope.freq_base_swa`), and the score scale is `1/sqrt(head_dim)`,
`1/sqrt(hidden/heads)` for the 62-layer 27B (or `attention.scale` when present). Every
`*norm.weight` is stored plus 1 (`Gemma3Model.norm_shift`); 1 is subtracted when read. For
|w| <= 1 (Gemma's norms) `s - 1` is exact (Sterbenz) and `1 + (s - 1)` is `s`, the float32
`1 + w` transformers multiplies by: the forward's `(1 + w)` is the same bits from both formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import CheckpointError, UnsupportedArchitectureError
from .base import Architecture, GGUFForm, Meta, TensorMap, names_from_map
from .common import (
    GELU_TANH,
    LAYER_TYPES,
    activation,
    config_int,
    decimal,
    decoder_fields,
    full_rotary,
    gguf_decoder,
    layer_windows,
    per_layer,
    plain_theta,
    positive,
    rope_theta_of,
    softcaps,
    write_decoder,
)
from .llama import GLOBAL_TENSORS, LAYER_TENSORS
from .qwen3 import QK_TENSORS

TENSORS = TensorMap({
    **GLOBAL_TENSORS, **LAYER_TENSORS, **QK_TENSORS,
    "blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
    "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm",
})
# `post_attention_layernorm` is the attention output's norm (Llama's pre-MLP norm is
# `pre_feedforward_layernorm`). Names are relative to the text model: `model.` in a
# Gemma3ForCausalLM file, `language_model.model.` / `model.language_model.` in a multimodal
# Gemma3ForConditionalGeneration file; the LM head is tied.
NAMES = names_from_map(TENSORS, in_out=False,
                       prefixes=("model.", "language_model.model.", "model.language_model."))

# Gemma3TextConfig's defaults (transformers 5.24) for fields a `text_config` may leave out
DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0, "tie_word_embeddings": True,
}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: a `gemma3` (multimodal) config's `text_config`, as
    transformers reads it; a `gemma3_text` config as it is."""
    if config.get("model_type") != "gemma3":
        return config
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        raise CheckpointError("config.json: model_type 'gemma3' needs a text_config object")
    if inner.get("model_type", "gemma3_text") != "gemma3_text":
        raise UnsupportedArchitectureError(f"config.json: text_config model_type "
                                           f"{inner.get('model_type')!r} is not supported")
    merged = dict(inner, model_type="gemma3_text")
    for key in ("bos_token_id", "eos_token_id", "tie_word_embeddings"):
        if merged.get(key) is None and config.get(key) is not None:
            merged[key] = config[key]
    return merged


def _thetas(config: dict[str, Any], windows: tuple[int | None, ...]) -> tuple[float, ...]:
    """RoPE theta per layer: transformers 5's `rope_parameters` keyed by layer type, or the
    older `rope_theta` (full layers, `rope_scaling` refused) and `rope_local_base_freq`."""
    params = config.get("rope_parameters")
    full_rotary(config)
    if isinstance(params, dict) and set(params) & set(LAYER_TYPES):
        used = {"sliding_attention" if w is not None else "full_attention" for w in windows}
        theta = {kind: plain_theta(params.get(kind), f"rope_parameters[{kind!r}]")
                 for kind in used}
    else:
        local = config.get("rope_local_base_freq")
        theta = {"full_attention": rope_theta_of(config),
                 "sliding_attention": plain_theta({"rope_theta": local},
                                                  "rope_local_base_freq")}
    return tuple(theta["sliding_attention" if w is not None else "full_attention"]
                 for w in windows)


def fields(config: dict[str, Any]) -> dict[str, Any]:
    config = text_config(config)
    caps = softcaps(config)
    if config.get("use_bidirectional_attention"):
        raise UnsupportedArchitectureError("config.json: use_bidirectional_attention is not "
                                           "supported (causal decoders only)")
    config = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    d = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    head_dim = config_int(config, "head_dim")
    layers = config_int(config, "num_hidden_layers")
    pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
    pattern = positive(pattern, "sliding_window_pattern")
    derived = ["sliding_attention" if (i + 1) % pattern else "full_attention"
               for i in range(layers)]
    windows = layer_windows(config, layers, config.get("sliding_window"), derived)
    scalar = config.get("query_pre_attn_scalar")
    if isinstance(scalar, bool) or not isinstance(scalar, int | float) or scalar <= 0:
        raise CheckpointError(f"config.json: query_pre_attn_scalar must be positive, got "
                              f"{scalar!r}")
    bias = bool(config.get("attention_bias", False))
    thetas = _thetas(config, windows)
    return dict(
        decoder_fields(config, "gemma3", d, heads, head_dim),
        norm_eps=float(config.get("rms_norm_eps") or 1e-6), mlp_bias=False,
        activation=activation(config, "hidden_activation", "gelu_pytorch_tanh", GELU_TANH),
        rope_theta=thetas[-1], qkv_bias=bias, out_bias=bias,
        tied_embeddings=bool(config.get("tie_word_embeddings")),
        attn_scale=float(scalar) ** -0.5, qk_norm=True, output_norms=True, norm_offset=1.0,
        embed_scale=float(d) ** 0.5, layers=per_layer(windows, thetas), **caps)


def gguf_layer_types(meta: Meta, layers: int) -> list[str]:
    """`layer_types` of a Gemma 3 GGUF: `attention.sliding_window_pattern` (a period n: every
    n-th layer full; or one bool per layer, true = sliding), else llama.cpp's period 6."""
    pattern = meta("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise UnsupportedArchitectureError(
                f"sliding_window_pattern has {len(pattern)} entries for {layers} layers")
        sliding = [bool(p) for p in pattern]
    else:
        period = int(pattern)
        sliding = [period > 0 and (i + 1) % period != 0 for i in range(layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def gguf_config(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
    out = gguf_decoder(meta, common, "gemma3_text")
    out["rms_norm_eps"] = decimal(meta("attention.layer_norm_rms_epsilon", 1e-6))
    scaling = meta("rope.scaling.type", None)
    if scaling not in (None, "none"):
        raise UnsupportedArchitectureError(
            f"{common['_path']}: RoPE scaling ({scaling}) is not supported (only plain RoPE)")
    full = {"rope_theta": decimal(meta("rope.freq_base", 1e6)), "rope_type": "default"}
    sliding = {"rope_theta": decimal(meta("rope.freq_base_swa", 10000.0)),
               "rope_type": "default"}
    scale = meta("attention.scale", None)
    if scale:
        scalar = 1.0 / float(scale) ** 2
    elif out["num_hidden_layers"] == 62:  # llama.cpp: LLM_TYPE_27B scales by hidden / heads
        scalar = out["hidden_size"] / out["num_attention_heads"]
    else:
        scalar = out["head_dim"]
    return {**out, "hidden_activation": "gelu_pytorch_tanh",
            "layer_types": gguf_layer_types(meta, out["num_hidden_layers"]),
            "sliding_window": int(meta("attention.sliding_window", 4096)),
            "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
            "query_pre_attn_scalar": scalar,
            "attn_logit_softcapping": meta("attn_logit_softcapping", None),
            "final_logit_softcapping": meta("final_logit_softcapping", None)}


def write_metadata(writer: Any, config: Mapping[str, Any]) -> None:
    """What `Gemma3Model.set_gguf_parameters` writes (the full layers' RoPE base, the window;
    neither the layer pattern nor the sliding base nor `query_pre_attn_scalar`)."""
    write_decoder(writer, config)
    writer.add_rope_freq_base(config["rope_parameters"]["full_attention"]["rope_theta"])
    writer.add_sliding_window(config["sliding_window"])


ARCH = Architecture(
    name="gemma3", model_types=("gemma3_text", "gemma3"), fields=fields, names=NAMES,
    gguf=GGUFForm("gemma3", TENSORS, gguf_config, write_metadata, norm_shift=1.0),
    doc=__doc__ or "")
