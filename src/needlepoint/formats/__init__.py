"""Archive readers and tokenizers: bytes on disk to typed, validated objects (bottom layer)."""
