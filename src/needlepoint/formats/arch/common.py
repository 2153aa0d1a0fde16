"""Readers shared by the architecture files: `config.json` fields (integers, special ids,
plain RoPE, sliding-window layer types, logit soft-capping, activations) and the `<arch>.*`
GGUF metadata every Llama-like decoder shares, in both directions. Each reader refuses what
it does not honour with an error naming the field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import CheckpointError, UnsupportedArchitectureError
from .base import REQUIRED, Meta

LAYER_TYPES = ("full_attention", "sliding_attention")
SILU = {"silu": "silu", "swish": "silu"}
GELU_TANH = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def config_int(config: dict[str, Any], key: str, default: Any = None) -> int:
    value = config.get(key)
    value = default if value is None else value
    if value is None:
        raise CheckpointError(f"config.json: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise CheckpointError(f"config.json: {key} must be an integer, got {value!r}")
    return int(value)


def special_id(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


def positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"config.json: {name} must be a positive integer, got {value!r}")
    return value


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
    full_rotary(config)
    theta = 10000.0 if theta is None else theta
    if not isinstance(theta, int | float) or theta <= 0:
        raise CheckpointError(f"config.json: rope_theta must be positive, got {theta!r}")
    return float(theta)


def full_rotary(config: dict[str, Any]) -> None:
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedArchitectureError("config.json: partial rotary embeddings are not "
                                           "supported")


def plain_theta(params: Any, where: str) -> float:
    """The theta of one RoPE parameter object (plain RoPE only)."""
    if not isinstance(params, dict):
        raise CheckpointError(f"config.json: {where} must be an object, got {params!r}")
    kind = params.get("rope_type", params.get("type"))
    if kind not in (None, "default"):
        raise UnsupportedArchitectureError(f"config.json: {where} RoPE type {kind!r} is not "
                                           f"supported (only plain RoPE)")
    theta = params.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise CheckpointError(f"config.json: {where} rope_theta must be positive, got {theta!r}")
    return float(theta)


def layer_windows(config: dict[str, Any], layers: int, window: Any,
                  derived: list[str]) -> tuple[int | None, ...]:
    """Per layer, the sliding window (`layer_types[i] == "sliding_attention"`) or None; the
    config's `layer_types`, else `derived` (the family's default rule)."""
    types = config.get("layer_types")
    types = derived if types is None else types
    if not isinstance(types, list) or len(types) != layers:
        raise CheckpointError(f"config.json: layer_types must list {layers} layer types, got "
                              f"{types!r}")
    for kind in types:
        if kind not in LAYER_TYPES:
            raise UnsupportedArchitectureError(f"config.json: layer_types entry {kind!r} is not "
                                               f"supported (only {', '.join(LAYER_TYPES)})")
    if "sliding_attention" in types:
        window = positive(window, "sliding_window (of the sliding_attention layers)")
    return tuple(window if kind == "sliding_attention" else None for kind in types)


def activation(config: dict[str, Any], key: str, default: str, table: dict[str, str]) -> str:
    name = config.get(key) or default
    if name not in table:
        raise UnsupportedArchitectureError(f"config.json: {key} {name!r} is not supported for "
                                           f"{config.get('model_type')} ({', '.join(table)})")
    return table[name]


def softcaps(config: dict[str, Any]) -> dict[str, float | None]:
    """`attn_logit_softcapping` and `final_logit_softcapping` (transformers' names; a GGUF
    file's `<arch>.attn_logit_softcapping` / `<arch>.final_logit_softcapping` are translated
    to them) as the spec's `attn_softcap` / `final_softcap`: a positive number, or None
    (absent, null or 0: off)."""
    out: dict[str, float | None] = {}
    for key, name in (("attn_logit_softcapping", "attn_softcap"),
                      ("final_logit_softcapping", "final_softcap")):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise CheckpointError(f"config.json: {key} must be a positive number or null, got "
                                  f"{value!r}")
        out[name] = float(value) if value else None
    return out


def decoder_fields(config: dict[str, Any], name: str, d: int, heads: int,
                   head_dim: int) -> dict[str, Any]:
    """The fields a Llama-like decoder (RMSNorm, gated MLP, RoPE, separate q/k/v) shares."""
    return dict(
        architecture=name, vocab=config_int(config, "vocab_size"), d_model=d,
        num_layers=config_int(config, "num_hidden_layers"), num_heads=heads,
        num_kv_heads=config_int(config, "num_key_value_heads", heads), head_dim=head_dim,
        d_ff=config_int(config, "intermediate_size"),
        max_seq_len=config_int(config, "max_position_embeddings", 2048), norm="rms",
        gated=True, rope=True, learned_positions=False, qkv_fused=False, norm_bias=False,
        scale_by_layer=False, bos_id=special_id(config, "bos_token_id"),
        eos_id=special_id(config, "eos_token_id"))


def per_layer(windows: tuple[int | None, ...], thetas: tuple[float, ...]) -> tuple[dict, ...]:
    """The `layers` field: each layer's sliding window and RoPE theta."""
    return tuple({"window": w, "theta": t} for w, t in zip(windows, thetas, strict=True))


# ---------------------------------------------------------------------------- GGUF metadata
def decimal(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not
    9.999999974752427e-07): `config.json` holds the decimal the converter was given, and every
    float32 use of the field (transformers adds eps to a float32 tensor) gets the same bits."""
    return float(str(np.float32(value)))


def plain_rope(path: str, meta: Meta) -> None:
    scaling = meta("rope.scaling.type", None)
    if scaling not in (None, "none"):
        raise UnsupportedArchitectureError(
            f"{path}: RoPE scaling ({scaling}) is not supported (only plain RoPE)")


def public(common: dict[str, Any]) -> dict[str, Any]:
    """The reader's common config fields, without its private helpers (`_path`, `_has`)."""
    return {k: v for k, v in common.items() if not k.startswith("_")}


def gguf_decoder(meta: Meta, common: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Fields every Llama-like decoder shares (`{arch}.*` keys as llama.cpp's converter writes
    them; the head width from `attention.key_length`, else hidden / heads)."""
    d, heads = int(meta("embedding_length", REQUIRED)), int(meta("attention.head_count", REQUIRED))
    head_dim = int(meta("attention.key_length", d // heads))
    rotary = int(meta("rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise UnsupportedArchitectureError(
            f"{common['_path']}: partial RoPE ({rotary} of {head_dim} dims) is not supported")
    return {
        "model_type": model_type, "hidden_size": d, "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": head_dim, "num_hidden_layers": int(meta("block_count", REQUIRED)),
        "intermediate_size": int(meta("feed_forward_length", REQUIRED)),
        "max_position_embeddings": int(meta("context_length", REQUIRED)),
        "rms_norm_eps": decimal(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        **public(common),
    }


def write_decoder(writer: Any, config: Mapping[str, Any]) -> None:
    """The `<arch>.*` keys `gguf_decoder` reads, from `config.json` fields (the writer's half:
    llama.cpp's `set_gguf_parameters` for a Llama-like decoder, RoPE base aside)."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
