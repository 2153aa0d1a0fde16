"""The user-facing Python API: `Needle`, tool schemas, the result envelope, evaluation."""
