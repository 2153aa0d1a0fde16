"""Llama-family and GPT-2 decoder-only transformers (Hugging Face safetensors, GGUF), one
spec-driven block (`spec.py`)."""
