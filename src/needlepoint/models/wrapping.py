"""The text side of a model that another object stands in for.

A layer range of a transformer (`transformer/layer_range.py`) and a request's leased view of
the served model (`api/lease.py`) both wrap a whole model and answer with its tokenizer and
chat format: one copy of that forwarding here (issue 27, one of each thing).
"""

from __future__ import annotations

from typing import Any


class WrapsModelText:
    """`tokenizer` and `chat_format` of the wrapped `self.model` (both cached there)."""

    model: Any

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def chat_format(self) -> Any:
        """The whole model's chat format (its template)."""
        return self.model.chat_format
