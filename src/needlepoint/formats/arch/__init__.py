"""One file per transformer architecture (`llama.py`, `gpt2.py`, `qwen2.py`, `qwen3.py`,
`gemma3.py`), the record each exports (`base.Architecture`), the readers they share
(`common.py`) and the registry built from them (`registry.py`); docs/architecture.md, "A new
transformer architecture"."""
