"""Gemma 2: Gemma 3's block without the per-head q/k norms, one RoPE theta for every layer,
sliding windows on every other layer (the first, third, ...: transformers' default
`layer_types`), and both logit soft-caps on by default (50 on the scores, 30 on the logits).

Honoured: `model_type` "gemma2"; Gemma2Config's defaults (transformers 5) for fields left
out; `layer_types`, `sliding_window`, `rope_theta`, `query_pre_attn_scalar`,
`hidden_activation`, `attention_bias`, `attn_logit_softcapping` and `final_logit_softcapping`
(an explicit null turns a cap off). Refused by name as Gemma 3 refuses them. No GGUF form:
llama.cpp's `gemma2` files are not read.
"""

from __future__ import annotations

from typing import Any

from . import gemma3
from .base import Architecture, TensorMap, names_from_map
from .common import config_int, layer_windows, rope_theta_of

TENSORS = TensorMap({gguf: hf for gguf, hf in gemma3.TENSORS.pairs.items()
                     if gguf not in ("blk.{i}.attn_q_norm", "blk.{i}.attn_k_norm")})
NAMES = names_from_map(TENSORS, in_out=False, prefixes=("model.",))

DEFAULTS = {
    "vocab_size": 256_000, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 10_000.0,
    "tie_word_embeddings": True, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
}
CAPS = ("attn_logit_softcapping", "final_logit_softcapping")


def fields(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's fields of the same config, read with Gemma 2's defaults, its alternating
    windows and one theta; no q/k norms."""
    config = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None or k in CAPS}}
    layers = config_int(config, "num_hidden_layers")
    derived = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    windows = layer_windows(config, layers, config.get("sliding_window"), derived)
    theta = rope_theta_of(config)
    read = gemma3.fields({**config, "model_type": "gemma3_text", "layer_types":
                          ["sliding_attention" if w else "full_attention" for w in windows],
                          "rope_parameters": None, "rope_scaling": None,
                          "rope_theta": theta, "rope_local_base_freq": theta})
    return dict(read, architecture="gemma2", qk_norm=False)


ARCH = Architecture(name="gemma2", model_types=("gemma2",), fields=fields, names=NAMES,
                    doc=__doc__ or "")
