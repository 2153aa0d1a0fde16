"""Qwen3: Qwen2 with a per-head RMSNorm over q and k before RoPE, an explicit `head_dim`, and
q/k/v/o biases only as `attention_bias` says. Config fields as Qwen2's. GGUF `qwen3`
(`attn_q_norm`, `attn_k_norm`), stored unpermuted."""

from __future__ import annotations

from typing import Any

from .base import Architecture, GGUFForm, Meta, TensorMap, names_from_map
from .llama import GLOBAL_TENSORS, LAYER_TENSORS
from .qwen2 import gguf_qwen_config, qwen_fields, write_qwen

QK_TENSORS = {"blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
              "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm"}
TENSORS = TensorMap({**GLOBAL_TENSORS, **LAYER_TENSORS, **QK_TENSORS})


def gguf_config(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
    return {**gguf_qwen_config(meta, common, "qwen3"),
            "attention_bias": common["_has"]("model.layers.0.self_attn.q_proj.bias")}


ARCH = Architecture(
    name="qwen3", model_types=("qwen3",), fields=lambda c: qwen_fields(c, "qwen3", True),
    names=names_from_map(TENSORS, in_out=False),
    gguf=GGUFForm("qwen3", TENSORS, gguf_config, write_qwen),
    doc=__doc__ or "")
