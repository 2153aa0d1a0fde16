"""Hugging Face tokenizers (`tokenizer.json`, or one built from GGUF metadata), via `tokenizers`.

`HFTokenizer` wraps a `tokenizers.Tokenizer` (the same Rust code transformers uses, so ids
match transformers exactly) with what needlepoint's generation side asks of a tokenizer:
`encode` / `decode`, `vocab_size`, `bos_id` / `eos_id`, per-token bytes (`token_bytes`,
`all_token_bytes`), piece types (`types`, the numbering of `formats.tokenizer.PieceType`),
`piece_to_id` / `id_to_piece` / `marker_id`, and the chat template (`apply_chat_template`).

Token bytes follow the tokenizer's decoder: byte-level BPE (GPT-2 style) maps each character
back through the GPT-2 bytes-to-unicode table; Metaspace / byte-fallback vocabularies (Llama
style) turn U+2581 into a space and `<0xNN>` pieces into their byte. Special added tokens
(`<s>`, `<|im_end|>`, ...) contribute no bytes (type CONTROL); non-special added tokens
(`<tool_call>`) their text (type USER_DEFINED).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TokenizerError
from .chat_template import render_chat_template
from .hf_extra import hf_extra
from .tokenizer import PieceType, UnknownPieceError, marker_in

SPACE = "\u2581"
BYTE_LEVEL, METASPACE, PLAIN = "byte_level", "metaspace", "plain"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    extra = 0
    for byte in range(256):
        if byte not in keep:
            keep.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


_UNICODE_TO_BYTE = {char: byte for byte, char in bytes_to_unicode().items()}


def _tokenizers() -> Any:
    with hf_extra("Hugging Face tokenizers need the `tokenizers` package", TokenizerError):
        import tokenizers
    return tokenizers


def byte_mode_of(decoder: Mapping[str, Any] | None) -> str:
    """How a `tokenizer.json` decoder turns pieces into bytes (BYTE_LEVEL, METASPACE, PLAIN)."""
    if not decoder:
        return PLAIN
    parts = decoder.get("decoders") if decoder.get("type") == "Sequence" else [decoder]
    kinds = {part.get("type") for part in parts or ()}
    if "ByteLevel" in kinds:
        return BYTE_LEVEL
    if kinds & {"Metaspace", "Replace", "ByteFallback"}:
        return METASPACE
    return PLAIN


class HFTokenizer:
    """A `tokenizers.Tokenizer` plus special ids, byte tables and the chat template."""

    # `tokenizer.json`'s own normalizer or pre-tokenizer places any prefix space, so a text
    # encoded mid-sequence has no SentencePiece dummy prefix to strip (`needle_wire`)
    add_dummy_prefix = False

    def __init__(
        self,
        backend: Any,
        *,
        byte_mode: str,
        bos_id: int | None = None,
        eos_id: int | None = None,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
        source: str = "",
    ) -> None:
        self.backend = backend
        self.byte_mode = byte_mode
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = None
        self.unk_id = None
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.source = source
        added = backend.get_added_tokens_decoder()
        self.added = {int(i): (tok.content, bool(tok.special)) for i, tok in added.items()}
        self.markers = {content: i for i, (content, _) in self.added.items()}

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> HFTokenizer:
        """`tokenizer.json` (+ `tokenizer_config.json`, `special_tokens_map.json`) of a model
        directory."""
        folder = Path(path)
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(f"{folder}: no tokenizer.json")
        try:
            spec = json.loads(file.read_text(encoding="utf-8"))
            backend = _tokenizers().Tokenizer.from_file(str(file))
        except Exception as error:  # json's ValueError, or the Rust side's own exception
            raise TokenizerError(f"{file}: not a valid tokenizer.json: {error}") from None
        config: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            extra = folder / name
            if extra.is_file():
                try:
                    config.update(json.loads(extra.read_text(encoding="utf-8")))
                except ValueError as error:
                    raise TokenizerError(f"{extra}: not valid JSON: {error}") from None
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {entry.get("name"): entry.get("template") for entry in template}
            template = named.get("default") or next(iter(named.values()), None)
        chat_file = folder / "chat_template.jinja"
        if template is None and chat_file.is_file():
            template = chat_file.read_text(encoding="utf-8")
        specials = {}
        for key in SPECIAL_TOKEN_KEYS:
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
        tokenizer = cls(backend, byte_mode=byte_mode_of(spec.get("decoder")),
                        chat_template=template, special_tokens=specials, source=str(file))
        ids = {key: backend.token_to_id(text) for key, text in specials.items()}
        tokenizer.bos_id, tokenizer.eos_id = ids.get("bos_token"), ids.get("eos_token")
        tokenizer.pad_id, tokenizer.unk_id = ids.get("pad_token"), ids.get("unk_token")
        return tokenizer

    # ------------------------------------------------------------------ text <-> ids
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`, as `tokenizer(text)` in transformers (special tokens added by the
        post-processor when `add_special_tokens`, e.g. a leading BOS)."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}")
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        checked = [self._check_id(t) for t in ids]
        return self.backend.decode(checked, skip_special_tokens=skip_special_tokens)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return b"".join(self.token_bytes(t) for t in ids)

    def _check_id(self, token_id: int) -> int:
        try:
            k = int(np.asarray(token_id).item()) if not isinstance(token_id, int) else token_id
        except (TypeError, ValueError):
            raise TokenizerError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= k < self.vocab_size:
            raise TokenizerError(f"token id {k} is outside the vocabulary [0, {self.vocab_size})")
        return k

    # ------------------------------------------------------------------ per-token tables
    @cached_property
    def _pieces(self) -> list[str]:
        pieces = [""] * self.vocab_size
        for piece, i in self.backend.get_vocab(with_added_tokens=True).items():
            if 0 <= i < self.vocab_size:
                pieces[i] = piece
        return pieces

    @cached_property
    def _tables(self) -> tuple[list[bytes], np.ndarray]:
        out: list[bytes] = []
        types = np.full(self.vocab_size, PieceType.NORMAL, np.int32)
        for i, piece in enumerate(self._pieces):
            if i in self.added:
                content, special = self.added[i]
                types[i] = PieceType.CONTROL if special else PieceType.USER_DEFINED
                out.append(b"" if special else content.encode("utf-8"))
            elif self.byte_mode == BYTE_LEVEL:
                out.append(bytes(_UNICODE_TO_BYTE.get(c, 0) for c in piece)
                           if all(c in _UNICODE_TO_BYTE for c in piece)
                           else piece.encode("utf-8"))
            elif self.byte_mode == METASPACE and (match := _BYTE_PIECE.fullmatch(piece)):
                types[i] = PieceType.BYTE
                out.append(bytes([int(match.group(1), 16)]))
            elif self.byte_mode == METASPACE:
                out.append(piece.replace(SPACE, " ").encode("utf-8"))
            else:
                out.append(piece.encode("utf-8"))
        types.setflags(write=False)
        return out, types

    @property
    def types(self) -> np.ndarray:
        """`PieceType` of every id (NORMAL, BYTE, CONTROL = special added, USER_DEFINED)."""
        return self._tables[1]

    def token_bytes(self, token_id: int) -> bytes:
        """Bytes one token contributes to decoded text (no decoder-level space stripping)."""
        return self._tables[0][self._check_id(token_id)]

    def all_token_bytes(self) -> list[bytes]:
        return list(self._tables[0])

    def piece_to_id(self, piece: str) -> int:
        token = self.backend.token_to_id(piece)
        if token is None:
            raise UnknownPieceError(f"piece {piece!r} is not in the vocabulary")
        return int(token)

    def id_to_piece(self, token_id: int) -> str:
        return self._pieces[self._check_id(token_id)]

    def marker_id(self, text: str) -> int:
        """Id of an added token (chat marker) such as "<|im_start|>" or "<tool_call>"."""
        return marker_in(self.markers, text, "an added token")

    # ------------------------------------------------------------------ chat template
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **variables: Any,
    ) -> str:
        """The rendered prompt text, as transformers' `apply_chat_template(tokenize=False)`."""
        if not self.chat_template:
            raise TokenizerError(f"{self.source or 'tokenizer'}: no chat template")
        return render_chat_template(
            self.chat_template, messages, tools=tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens, **variables,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """Ids of the rendered chat prompt (`encode(rendered, add_special_tokens)`)."""
        text = self.apply_chat_template(messages, tools=tools,
                                        add_generation_prompt=add_generation_prompt)
        return self.encode(text, add_special_tokens=add_special_tokens)

    def __repr__(self) -> str:
        return (f"HFTokenizer(vocab_size={self.vocab_size}, bytes={self.byte_mode}, "
                f"chat_template={'yes' if self.chat_template else 'no'})")
