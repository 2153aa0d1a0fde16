"""llama.cpp's architectures in GGUF, translated to Hugging Face names and config fields.

One `GGUFArch` per `general.architecture` llama.cpp writes for the families the transformer
runs (issue 28 item 2): `llama`, `gpt2`, `qwen2`, `qwen3`, `gemma3`. Each says

* which GGUF tensor (`blk.{i}.attn_q`, `token_embd`, ...) is which Hugging Face tensor (the
  names of llama.cpp's `gguf.constants.TENSOR_NAMES` / `tensor_mapping.py`);
* whether llama.cpp's converter permuted the q/k rows into interleaved-pair RoPE order: only
  `LlamaModel.modify_tensors` does (`permute(data_torch, n_head, n_head)` for q_proj and
  `n_kv_head` for k_proj); `Qwen2Model`, `Qwen3Model` (a `Qwen2Model`) and `Gemma3Model`
  store them as Hugging Face does (llama.cpp runs NEOX-style RoPE for them);
* the norm shift: `Gemma3Model.modify_tensors` stores every `*norm.weight` plus 1 (its
  `norm_shift`, "Gemma3RMSNorm adds 1.0 to the norm value"), so 1 is subtracted here and the
  checkpoint offers Hugging Face's `w`. For |w| <= 1 (Gemma's norms), `s - 1` is exact
  (Sterbenz) and `1 + (s - 1)` is `s`, the float32 `1 + w` transformers multiplies by: the
  forward's `(1 + w)` is the same bits from both formats;
* how the `{arch}.*` metadata becomes `config.json` fields (the dict `spec.py` reads).

Gemma 3 details follow llama.cpp's `llama-model.cpp`, which stores neither the layer pattern,
the sliding layers' RoPE base nor `query_pre_attn_scalar`: the pattern is 5 sliding layers then
one full (`set_swa_pattern(6)`, or `attention.sliding_window_pattern` when present), sliding
layers use base 10000 (or `rope.freq_base_swa`), and the score scale is `1/sqrt(head_dim)`,
`1/sqrt(hidden/heads)` for the 62-layer 27B (or `attention.scale` when present).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnsupportedArchitectureError

Meta = Callable[[str, Any], Any]  # (key under "{arch}.", default) -> value
REQUIRED = object()  # a Meta default: the key must be present (else a CheckpointError)

_LLAMA_LAYER = {
    "attn_norm": "model.layers.{i}.input_layernorm",
    "attn_q": "model.layers.{i}.self_attn.q_proj",
    "attn_k": "model.layers.{i}.self_attn.k_proj",
    "attn_v": "model.layers.{i}.self_attn.v_proj",
    "attn_output": "model.layers.{i}.self_attn.o_proj",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "ffn_up": "model.layers.{i}.mlp.up_proj",
    "ffn_down": "model.layers.{i}.mlp.down_proj",
}
_HEAD_NORMS = {"attn_q_norm": "model.layers.{i}.self_attn.q_norm",
               "attn_k_norm": "model.layers.{i}.self_attn.k_norm"}
_GEMMA3_LAYER = {
    **_LLAMA_LAYER, **_HEAD_NORMS,
    "post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    "ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
    "post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm",
}
_LLAMA_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_GPT2_LAYER = {
    "attn_norm": "transformer.h.{i}.ln_1",
    "attn_qkv": "transformer.h.{i}.attn.c_attn",
    "attn_output": "transformer.h.{i}.attn.c_proj",
    "ffn_norm": "transformer.h.{i}.ln_2",
    "ffn_up": "transformer.h.{i}.mlp.c_fc",
    "ffn_down": "transformer.h.{i}.mlp.c_proj",
}
_GPT2_GLOBAL = {"token_embd": "transformer.wte", "position_embd": "transformer.wpe",
                "output_norm": "transformer.ln_f", "output": "lm_head"}
GPT2_CONV1D = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class GGUFArch:
    """How one GGUF architecture maps to Hugging Face (module doc)."""

    name: str
    globals_: dict[str, str]
    layer: dict[str, str]
    permuted_qk: bool  # llama.cpp's converter permuted q/k rows (Llama only)
    norm_shift: float  # added to every norm weight by the converter (Gemma 3: 1.0)
    config: Callable[[Meta, dict[str, Any]], dict[str, Any]]  # (metadata, common) -> config

    @property
    def embed(self) -> str:
        return f"{self.globals_['token_embd']}.weight"

    def is_norm(self, base: str) -> bool:
        return base.endswith("norm")


def decimal(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not
    9.999999974752427e-07): `config.json` holds the decimal the converter was given, and every
    float32 use of the field (transformers adds eps to a float32 tensor) gets the same bits."""
    return float(str(np.float32(value)))


def _plain_rope(path: str, meta: Meta) -> None:
    scaling = meta("rope.scaling.type", None)
    if scaling not in (None, "none"):
        raise UnsupportedArchitectureError(
            f"{path}: RoPE scaling ({scaling}) is not supported (only plain RoPE)")


def _decoder(meta: Meta, common: dict[str, Any], model_type: str) -> dict[str, Any]:
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
        **{k: v for k, v in common.items() if not k.startswith("_")},
    }


def _llama(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
    _plain_rope(common["_path"], meta)
    return {**_decoder(meta, common, "llama"),
            "rope_theta": float(meta("rope.freq_base", 10000.0)), "hidden_act": "silu",
            "attention_bias": common["_has"]("model.layers.0.self_attn.q_proj.bias"),
            "mlp_bias": common["_has"]("model.layers.0.mlp.gate_proj.bias")}


def _qwen(model_type: str) -> Callable[[Meta, dict[str, Any]], dict[str, Any]]:
    def config(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
        _plain_rope(common["_path"], meta)
        out = {**_decoder(meta, common, model_type), "hidden_act": "silu",
               "rope_parameters": {"rope_theta": decimal(meta("rope.freq_base", 1e6)),
                                   "rope_type": "default"},
               "use_sliding_window": False, "sliding_window": None}
        out["layer_types"] = ["full_attention"] * out["num_hidden_layers"]
        if model_type == "qwen3":
            out["attention_bias"] = common["_has"]("model.layers.0.self_attn.q_proj.bias")
        return out

    return config


def gemma3_layer_types(meta: Meta, layers: int) -> list[str]:
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


def _gemma3(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
    out = _decoder(meta, common, "gemma3_text")
    out["rms_norm_eps"] = decimal(meta("attention.layer_norm_rms_epsilon", 1e-6))
    full = {"rope_theta": decimal(meta("rope.freq_base", 1e6)), "rope_type": "default"}
    scaling = meta("rope.scaling.type", None)
    if scaling == "linear":
        full = {**full, "rope_type": "linear", "factor": float(meta("rope.scaling.factor", 1.0))}
    elif scaling not in (None, "none"):
        raise UnsupportedArchitectureError(
            f"{common['_path']}: RoPE scaling ({scaling}) is not supported for gemma3")
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
            "layer_types": gemma3_layer_types(meta, out["num_hidden_layers"]),
            "sliding_window": int(meta("attention.sliding_window", 4096)),
            "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
            "query_pre_attn_scalar": scalar,
            "attn_logit_softcapping": meta("attn_logit_softcapping", None),
            "final_logit_softcapping": meta("final_logit_softcapping", None)}


def _gpt2(meta: Meta, common: dict[str, Any]) -> dict[str, Any]:
    d, heads = int(meta("embedding_length", REQUIRED)), int(meta("attention.head_count", REQUIRED))
    return {"model_type": "gpt2", "n_embd": d, "n_head": heads,
            "n_layer": int(meta("block_count", REQUIRED)),
            "n_inner": int(meta("feed_forward_length", REQUIRED)),
            "n_positions": int(meta("context_length", REQUIRED)),
            "layer_norm_epsilon": decimal(meta("attention.layer_norm_epsilon", 1e-5)),
            "activation_function": "gelu_new",
            **{k: v for k, v in common.items() if not k.startswith("_")}}


ARCHITECTURES: dict[str, GGUFArch] = {
    "llama": GGUFArch("llama", _LLAMA_GLOBAL, _LLAMA_LAYER, True, 0.0, _llama),
    "gpt2": GGUFArch("gpt2", _GPT2_GLOBAL, _GPT2_LAYER, False, 0.0, _gpt2),
    "qwen2": GGUFArch("qwen2", _LLAMA_GLOBAL, _LLAMA_LAYER, False, 0.0, _qwen("qwen2")),
    "qwen3": GGUFArch("qwen3", _LLAMA_GLOBAL, {**_LLAMA_LAYER, **_HEAD_NORMS}, False, 0.0,
                      _qwen("qwen3")),
    "gemma3": GGUFArch("gemma3", _LLAMA_GLOBAL, _GEMMA3_LAYER, False, 1.0, _gemma3),
}
