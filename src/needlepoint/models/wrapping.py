"""The text side of a model that another object stands in for.

A layer range of a transformer (`transformer/layer_range.py`) and a request's leased view of
the served model (`api/lease.py`) both wrap a whole model and answer with its tokenizer and
chat format: one copy of that forwarding here (one of each thing). A Needle model and
a Needle 3 layer range answer from the archive they read (`NeedleArchiveText`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from ..formats.chat_format import NeedleFormat


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


class NeedleArchiveText:
    """`tokenizer` (the archive's own, built on first use) and `chat_format` (Needle's wire
    format, `formats/chat_format.py`) of an object that reads `self.archive`."""

    archive: Any

    def __init__(self, archive: Any, config: Any, layer_indices: tuple[int, ...]) -> None:
        """A model of `archive`: the geometry of the ladder rung it runs (`config`) and the
        archive blocks that rung keeps (`layer_indices`)."""
        self.archive = archive
        self.config = config
        self.layer_indices = layer_indices

    @property
    def tokenizer(self) -> Any:
        return self.archive.tokenizer

    @cached_property
    def chat_format(self) -> NeedleFormat:
        return NeedleFormat(self.tokenizer)
