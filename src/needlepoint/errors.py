"""Typed errors: every bad input a user can hand needlepoint maps to one of these."""

from __future__ import annotations


class NeedlepointError(Exception):
    """Base class of every error needlepoint raises on purpose."""


class CactFormatError(NeedlepointError, ValueError):
    """The `.cact` archive is malformed: truncated, corrupt, or inconsistent with its header."""


class TokenizerError(NeedlepointError, ValueError):
    """Bad tokenizer input: a corrupt blob or a token id outside the vocabulary."""


class ModelInputError(NeedlepointError, ValueError):
    """Bad model input: token id out of range, empty or over-long sequence, cache exhausted."""


class ToolSchemaError(NeedlepointError, ValueError):
    """A tool definition cannot be turned into a JSON schema the model and grammar accept."""
