"""`needlepoint inspect` on a GGUF file or a Hugging Face safetensors directory: what the
checkpoint holds, without loading its weights. The architecture, the geometry as the engine
reads it (`BlockSpec`), the tensors per storage type (count, parameters), the parameters and
bytes in all, the context length, and the chat template with the tool-call syntax it implies
(none: a base model, which `needlepoint run --raw` continues as plain text).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import Any

GEOMETRY = ("architecture", "vocab", "d_model", "num_layers", "num_heads", "num_kv_heads",
            "head_dim", "d_ff", "max_seq_len", "norm", "activation", "tied_embeddings",
            "attn_softcap", "final_softcap")


def _bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return path.stat().st_size


def _chat(checkpoint: Any) -> dict[str, Any]:
    """The chat template's presence and the call syntax the engine reads from it."""
    from ..errors import NeedlepointError
    from ..formats.chat_format import TemplateFormat
    from ..generation.syntaxes import syntax_for

    tokenizer = checkpoint.tokenizer
    template = tokenizer.chat_template
    out: dict[str, Any] = {"tokenizer_vocab": int(tokenizer.vocab_size),
                           "chat_template": bool(template), "call_syntax": None}
    if not template:
        out["note"] = "no chat template: a base model (continue text with `run --raw`)"
        return out
    try:
        fmt = TemplateFormat(tokenizer)
        syntax = syntax_for(fmt)
    except NeedlepointError as error:
        out["note"] = f"the chat template cannot be used: {error}"
        return out
    out["call_syntax"] = {"syntax": syntax.name, "open": syntax.open, "close": syntax.close,
                          "body": syntax.body, "template_renders_tools": fmt.renders_tools}
    return out


def summarize_checkpoint(path: str | Path) -> dict[str, Any]:
    """The summary of a GGUF file or an HF directory (module doc), as one JSON-able dict."""
    from ..formats.checkpoints import open_checkpoint
    from ..models.transformer.spec import spec_from_config

    path = Path(path)
    checkpoint = open_checkpoint(path)
    spec = spec_from_config(checkpoint.config)
    types: Counter[str] = Counter()
    params: Counter[str] = Counter()
    for name in checkpoint.names():
        dtype = str(checkpoint.dtype(name))
        types[dtype] += 1
        params[dtype] += math.prod(checkpoint.shape(name))
    geometry = {k: v for k, v in dataclasses.asdict(spec).items() if k in GEOMETRY}
    return {
        "path": str(path), "format": "gguf" if path.is_file() else "safetensors",
        "architecture": spec.architecture,
        "model_type": checkpoint.config.get("model_type"),
        "geometry": geometry, "context": spec.max_seq_len,
        "tensor_types": {t: {"tensors": types[t], "parameters": params[t]}
                         for t in sorted(types)},
        "parameters": sum(params.values()), "bytes": _bytes(path),
        **_chat(checkpoint),
    }


def render_checkpoint(summary: dict[str, Any]) -> None:
    """The summary as text tables."""
    print(f"{summary['path']}: {summary['format']}, {summary['architecture']} "
          f"({summary['model_type']})")
    print(f"  parameters {summary['parameters']:,} | bytes {summary['bytes']:,} | "
          f"context {summary['context']:,}")
    print("  geometry: " + ", ".join(f"{k} {v}" for k, v in summary["geometry"].items()
                                     if v is not None))
    print("  tensor types:")
    for dtype, entry in summary["tensor_types"].items():
        print(f"    {dtype:<8} {entry['tensors']:>5} tensors {entry['parameters']:>14,} "
              "parameters")
    syntax = summary.get("call_syntax")
    template = "yes" if summary["chat_template"] else "no"
    print(f"  tokenizer: {summary['tokenizer_vocab']:,} tokens; chat template: {template}")
    if syntax:
        print(f"  tool calls: {syntax['syntax']} ({syntax['open']} ... {syntax['close']}, "
              f"{syntax['body']} body)")
    if summary.get("note"):
        print(f"  note: {summary['note']}")


__all__ = ["render_checkpoint", "summarize_checkpoint"]
