"""GGUF copies of the Qwen2 / Qwen3 / Gemma 3 fixtures, written with `gguf.GGUFWriter` the way
llama.cpp's `convert_hf_to_gguf.py` writes these families (issue 28 item 2):

* architecture names `qwen2`, `qwen3`, `gemma3` and `gguf.constants`' tensor names
  (`blk.{i}.attn_q`, `attn_q_norm`, `post_attention_norm`, `post_ffw_norm`, ...);
* no q/k row permutation (only `LlamaModel` permutes; `Qwen2Model`, `Qwen3Model`,
  `Gemma3Model` do not);
* Gemma 3: every `*norm.weight` stored plus 1 (`Gemma3Model.norm_shift`), the metadata
  `Gemma3Model.set_gguf_parameters` writes (the full layers' RoPE base, `key_length`,
  `sliding_window`; neither the layer pattern nor the sliding base nor `query_pre_attn_scalar`);
* the tokenizer as `tokenizer.ggml.*`: Qwen's byte-level BPE (`gpt2`, pre-tokenizer `qwen2`,
  its merges); Gemma's SentencePiece-style vocabulary (`llama`, scores, no space prefix);
  the chat template from `tokenizer_config.json`.

The file holds the fixture's own weights (F32, or 2-D weights quantised by `gguf.quants`), so a
model read from it must give the fixture's transformers references.
"""

from __future__ import annotations

import json
from pathlib import Path

from hf_helpers import hf_fixture_dir, hf_token_table

from needlepoint.formats import gguf_write as write

FAMILY_FIXTURES = {"qwen2-tiny": "qwen2", "qwen3-tiny": "qwen3", "gemma3-tiny": "gemma3"}

# llama.cpp's tensor names, in needlepoint's writer (the benchmark writes with it too)
gguf_tensor_name = write.gguf_tensor_name


def fixture_vocab(folder: Path, arch: str) -> write.GgufVocab:
    """The tokenizer of the fixture in `folder` as llama.cpp's converter writes it for `arch`."""
    spec, config, added, tokens, types = hf_token_table(folder)
    ids = {t["content"]: i for i, t in added.items()}
    template = config.get("chat_template")
    if arch == "gemma3":  # llama.cpp's _set_vocab_sentencepiece + add_space_prefix(False)
        types[ids["<unk>"]] = 2
        return write.GgufVocab(
            "llama", tokens, types, scores=[-float(i) for i in range(len(tokens))],
            add_space_prefix=False, add_bos=True, chat_template=template,
            special={k: ids[f"<{k}>"] for k in ("bos", "eos", "unk", "pad")})
    # llama.cpp's _set_vocab_gpt2 (Qwen: pre-tokenizer "qwen2", no BOS)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return write.GgufVocab("gpt2", tokens, types, merges=merges, pre="qwen2",
                           chat_template=template,
                           special={"eos": ids[config["eos_token"]],
                                    "pad": ids[config["pad_token"]]})


def q4_k_m_type(tensor_name: str, cols: int) -> str:
    """A Q4_K_M-style choice per 2-D weight: K-quants need rows of 256, so `ffn_down` (the
    only such rows in these fixtures) is Q4_K in even layers and Q6_K in odd ones (llama.cpp's
    Q4_K_M also gives some `ffn_down` more bits); every other matrix Q8_0."""
    if cols % 256 or "mlp.down_proj" not in tensor_name:
        return "Q8_0"
    layer = int(tensor_name.split(".")[2])
    return "Q4_K" if layer % 2 == 0 else "Q6_K"


def write_family_gguf(name: str, out: Path, qtype: str = "F32", *, extra=None) -> Path:
    """The fixture `name` (qwen2-tiny, qwen3-tiny, gemma3-tiny) as llama.cpp's converter writes
    it (module doc); 2-D weights in `qtype` (F32, F16, Q8_0, Q4_0, ... as `gguf.quants`
    quantises them; "Q4_K_M": `q4_k_m_type`), 1-D tensors F32. `extra(writer)` adds metadata
    (error tests)."""
    from safetensors.numpy import load_file

    folder = hf_fixture_dir(name)
    arch = FAMILY_FIXTURES[name]
    config = json.loads((folder / "config.json").read_text())
    kind = (lambda tensor, shape: q4_k_m_type(tensor, shape[1])) if qtype == "Q4_K_M" else qtype
    return write.write_gguf(out, arch, config,
                            load_file(str(folder / "model.safetensors")).items(),
                            fixture_vocab(folder, arch), kind, extra=extra)
