"""Reading `config.json` fields for the block spec (`spec.py`), and the fields of the Qwen2,
Qwen3 and Gemma 3 families (issue 28 item 1; `shared/fixtures/hf/README.md`, second part,
"What differs from the Llama forward pass").

Each family's reader returns the `BlockSpec` fields as a dict: the differences between
families are spec fields, never branches in the maths. Every config field that changes the
forward is honoured or refused here, with an error naming it: sliding windows and
`layer_types`, RoPE per layer type and its scaling, `query_pre_attn_scalar`, attention and
final logit soft-capping, `use_sliding_window` / `max_window_layers`, `head_dim`,
tied embeddings, bidirectional attention (refused).
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import CheckpointError, UnsupportedArchitectureError

LAYER_TYPES = ("full_attention", "sliding_attention")
_SILU = {"silu": "silu", "swish": "silu"}
_GELU_TANH = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


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




def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: a `gemma3` (multimodal) config's `text_config`, as
    transformers reads it (special ids and tied embeddings from the outer config when the
    text config leaves them out); any other config as it is."""
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


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"config.json: {name} must be a positive integer, got {value!r}")
    return value


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
        window = _positive(window, "sliding_window (of the sliding_attention layers)")
    return tuple(window if kind == "sliding_attention" else None for kind in types)


def _plain_theta(params: Any, where: str) -> float:
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


def _activation(config: dict[str, Any], key: str, default: str, table: dict[str, str]) -> str:
    name = config.get(key) or default
    if name not in table:
        raise UnsupportedArchitectureError(f"config.json: {key} {name!r} is not supported for "
                                           f"{config.get('model_type')} ({', '.join(table)})")
    return table[name]


def _common(config: dict[str, Any], d: int, heads: int, head_dim: int) -> dict[str, Any]:
    return dict(
        architecture=config["model_type"], vocab=config_int(config, "vocab_size"), d_model=d,
        num_layers=config_int(config, "num_hidden_layers"), num_heads=heads,
        num_kv_heads=config_int(config, "num_key_value_heads", heads), head_dim=head_dim,
        d_ff=config_int(config, "intermediate_size"),
        max_seq_len=config_int(config, "max_position_embeddings", 2048), norm="rms",
        norm_eps=float(config.get("rms_norm_eps") or 1e-6), gated=True, rope=True,
        learned_positions=False, qkv_fused=False, mlp_bias=False, norm_bias=False,
        scale_by_layer=False, bos_id=special_id(config, "bos_token_id"),
        eos_id=special_id(config, "eos_token_id"))


def qwen_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Qwen2 / Qwen2.5 (q, k, v biases) and Qwen3 (per-head q/k RMSNorm before RoPE, an
    explicit head_dim): Llama otherwise. A sliding window applies where `layer_types` says
    "sliding_attention", or (no `layer_types`) with `use_sliding_window` from layer
    `max_window_layers` on, as transformers' Qwen configs derive it."""
    d = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    head_dim = config_int(config, "head_dim", d // heads)
    qwen3 = config["model_type"] == "qwen3"
    layers = config_int(config, "num_hidden_layers")
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    start = config_int(config, "max_window_layers", layers)
    derived = ["sliding_attention" if window is not None and i >= start else "full_attention"
               for i in range(layers)]
    bias = bool(config.get("attention_bias", False))
    return dict(
        _common(config, d, heads, head_dim),
        activation=_activation(config, "hidden_act", "silu", _SILU),
        rope_theta=rope_theta_of(config), qkv_bias=bias if qwen3 else True,
        out_bias=bias if qwen3 else False,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attn_scale=1.0 / math.sqrt(head_dim), qk_norm=qwen3,
        windows=layer_windows(config, layers, window, derived))


# Gemma3TextConfig's defaults (transformers 5.24) for fields a `text_config` may leave out
GEMMA3_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0, "tie_word_embeddings": True,
}


def _gemma_thetas(config: dict[str, Any], windows: tuple[int | None, ...]) -> tuple[float, ...]:
    """RoPE theta per layer: transformers 5's `rope_parameters` keyed by layer type, or the
    older `rope_theta` (full layers, `rope_scaling` refused) and `rope_local_base_freq`."""
    params = config.get("rope_parameters")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedArchitectureError("config.json: partial rotary embeddings are not "
                                           "supported")
    if isinstance(params, dict) and set(params) & set(LAYER_TYPES):
        used = {"sliding_attention" if w is not None else "full_attention" for w in windows}
        theta = {kind: _plain_theta(params.get(kind), f"rope_parameters[{kind!r}]")
                 for kind in used}
    else:
        local = config.get("rope_local_base_freq")
        theta = {"full_attention": rope_theta_of(config),
                 "sliding_attention": _plain_theta({"rope_theta": local},
                                                   "rope_local_base_freq")}
    return tuple(theta["sliding_attention" if w is not None else "full_attention"]
                 for w in windows)


def softcaps(config: dict[str, Any]) -> dict[str, float | None]:
    """`attn_logit_softcapping` and `final_logit_softcapping` (transformers' names; a GGUF
    file's `<arch>.attn_logit_softcapping` / `<arch>.final_logit_softcapping` are translated
    to them) as the spec's `attn_softcap` / `final_softcap`: a positive number, or None
    (absent, null or 0: off)."""
    out: dict[str, float | None] = {}
    for key, field in (("attn_logit_softcapping", "attn_softcap"),
                       ("final_logit_softcapping", "final_softcap")):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise CheckpointError(f"config.json: {key} must be a positive number or null, got "
                                  f"{value!r}")
        out[field] = float(value) if value else None
    return out


def gemma3_fields(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3 text: scaled embedding, `1 + w` RMSNorms (four per layer and per-head q/k),
    sliding and full layers with their own RoPE theta, `query_pre_attn_scalar`, gelu-tanh,
    tied embeddings, logit soft-capping where the config sets it (`softcaps`).
    Bidirectional attention is refused."""
    caps = softcaps(config)
    if config.get("use_bidirectional_attention"):
        raise UnsupportedArchitectureError("config.json: use_bidirectional_attention is not "
                                           "supported (causal decoders only)")
    config = {**GEMMA3_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    d = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    head_dim = config_int(config, "head_dim")
    layers = config_int(config, "num_hidden_layers")
    pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
    pattern = _positive(pattern, "sliding_window_pattern")
    derived = ["sliding_attention" if (i + 1) % pattern else "full_attention"
               for i in range(layers)]
    windows = layer_windows(config, layers, config.get("sliding_window"), derived)
    scalar = config.get("query_pre_attn_scalar")
    if isinstance(scalar, bool) or not isinstance(scalar, int | float) or scalar <= 0:
        raise CheckpointError(f"config.json: query_pre_attn_scalar must be positive, got "
                              f"{scalar!r}")
    bias = bool(config.get("attention_bias", False))
    thetas = _gemma_thetas(config, windows)
    return dict(
        _common(config, d, heads, head_dim),
        activation=_activation(config, "hidden_activation", "gelu_pytorch_tanh", _GELU_TANH),
        rope_theta=thetas[-1], qkv_bias=bias, out_bias=bias,
        tied_embeddings=bool(config.get("tie_word_embeddings")),
        attn_scale=float(scalar) ** -0.5, qk_norm=True, output_norms=True, norm_offset=1.0,
        embed_scale=float(d) ** 0.5, windows=windows, thetas=thetas, **caps)


FAMILY_FIELDS = {"qwen2": qwen_fields, "qwen3": qwen_fields, "gemma3_text": gemma3_fields}
