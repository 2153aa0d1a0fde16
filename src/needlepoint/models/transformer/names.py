"""Where each weight of a spec lives in a checkpoint: Hugging Face tensor names per family.

A table, not code paths: `TensorNames` gives the name of every tensor the block needs (per layer
with `{i}`), and whether linear weights are stored `[out, in]` (torch `nn.Linear`, applied as
x W^T) or `[in, out]` (GPT-2's `Conv1D`, applied as x W). Biases sit beside their weight
(`.weight` -> `.bias`). A GGUF file's tensors are renamed to these names when it is opened
(`formats/gguf_checkpoint.py`). Names: `shared/fixtures/hf/README.md`, "Tensor names and shapes".
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class TensorNames:
    embed: str
    positions: str | None
    final_norm: str
    lm_head: str
    norm1: str
    norm2: str
    q: str | None  # separate projections (None when fused)
    k: str | None
    v: str | None
    qkv: str | None  # fused q | k | v (None when separate)
    o: str
    gate: str | None  # gated MLP only
    up: str
    down: str
    in_out: bool  # linear weights stored [in, out]
    prefixes: tuple[str, ...] = ("",)  # optional name prefixes, tried in order
    q_norm: str | None = None  # per-head q / k norms (spec.qk_norm)
    k_norm: str | None = None
    attn_out_norm: str | None = None  # norms of the attention / MLP outputs (spec.output_norms)
    mlp_out_norm: str | None = None

    def layer(self, template: str, index: int) -> str:
        return template.format(i=index)


LLAMA = TensorNames(
    embed="model.embed_tokens.weight",
    positions=None,
    final_norm="model.norm.weight",
    lm_head="lm_head.weight",
    norm1="model.layers.{i}.input_layernorm.weight",
    norm2="model.layers.{i}.post_attention_layernorm.weight",
    q="model.layers.{i}.self_attn.q_proj.weight",
    k="model.layers.{i}.self_attn.k_proj.weight",
    v="model.layers.{i}.self_attn.v_proj.weight",
    qkv=None,
    o="model.layers.{i}.self_attn.o_proj.weight",
    gate="model.layers.{i}.mlp.gate_proj.weight",
    up="model.layers.{i}.mlp.up_proj.weight",
    down="model.layers.{i}.mlp.down_proj.weight",
    in_out=False,
)

# GPT-2 checkpoints come with the `transformer.` prefix (GPT2LMHeadModel) or without (GPT2Model).
GPT2 = TensorNames(
    embed="wte.weight",
    positions="wpe.weight",
    final_norm="ln_f.weight",
    lm_head="lm_head.weight",
    norm1="h.{i}.ln_1.weight",
    norm2="h.{i}.ln_2.weight",
    q=None,
    k=None,
    v=None,
    qkv="h.{i}.attn.c_attn.weight",
    o="h.{i}.attn.c_proj.weight",
    gate=None,
    up="h.{i}.mlp.c_fc.weight",
    down="h.{i}.mlp.c_proj.weight",
    in_out=True,
    prefixes=("transformer.", ""),
)

QWEN = replace(LLAMA, q_norm="model.layers.{i}.self_attn.q_norm.weight",
               k_norm="model.layers.{i}.self_attn.k_norm.weight")

# Gemma 3: `post_attention_layernorm` is the attention output's norm (Llama's pre-MLP norm is
# `pre_feedforward_layernorm`). Names are relative to the text model: `model.` in a
# Gemma3ForCausalLM file, `language_model.model.` / `model.language_model.` in a multimodal
# Gemma3ForConditionalGeneration file (its vision tower is not read); the LM head is tied.
GEMMA3 = replace(
    TensorNames(**{f.name: (value.removeprefix("model.") if isinstance(value, str) else value)
                   for f in fields(QWEN) for value in [getattr(QWEN, f.name)]}),
    norm2="layers.{i}.pre_feedforward_layernorm.weight",
    attn_out_norm="layers.{i}.post_attention_layernorm.weight",
    mlp_out_norm="layers.{i}.post_feedforward_layernorm.weight",
    prefixes=("model.", "language_model.model.", "model.language_model."),
)

# Gemma 2: Gemma 3's names without the per-head q/k norms
GEMMA2 = replace(GEMMA3, q_norm=None, k_norm=None)

NAMES = {"llama": LLAMA, "gpt2": GPT2, "qwen2": LLAMA, "qwen3": QWEN, "gemma3_text": GEMMA3,
         "gemma2": GEMMA2}


def bias_name(weight: str) -> str:
    return weight[: -len(".weight")] + ".bias" if weight.endswith(".weight") else weight + ".bias"
