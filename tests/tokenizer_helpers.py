"""Shared pieces of the tokenizer tests (`test_tokenizer_*.py`): the fixtures, each one's
tokenizer blob (read from the archive, as the sidecar or the toy's header locates it), the
tokenizer built from it, the SentencePiece model it was made from, and the test corpus.
Spec: needle3 README "Tokenizer blob (RAW)" / "Tokenizer", needle2 README "Tokenizer blob" /
"Tokenizer and special ids".
"""

from __future__ import annotations

import struct
from functools import cache

import sentencepiece as spm
from conftest import get_fixture, toy_model_path
from tokenizer_corpus import make_corpus

from needlepoint.formats.tokenizer import Tokenizer

FIXTURES = [(g, n) for g in ("needle3", "needle2") for n in ("tiny", "small", "shipped")]
ALL = [*FIXTURES, ("toy", "needle3-toy")]
SPACE = "\u2581"


def _blob_record(fixture) -> dict:
    """The tokenizer's directory entry in the sidecar (last record of the archive)."""
    meta = fixture.meta
    records = meta["directory"] if fixture.generation == "needle3" else meta["archive"]["tensors"]
    rec = records[-1]
    assert rec["name"] == "tokenizer"
    return rec


def _read(path, offset: int, nbytes: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(nbytes)
    assert len(data) == nbytes, f"{path} is truncated"
    return data


def _toy_blob() -> bytes:
    """needle3-toy has no sidecar: read its last directory record from the header
    (needle3 README "The .cact archive": 196-byte header, codebooks, 44-byte records)."""
    path = toy_model_path()
    head = _read(path, 0, 196)
    num_tensors, codebook_len = struct.unpack_from("<2I", head, 4)
    rec = _read(path, 196 + 4 * codebook_len + 44 * (num_tensors - 1), 44)
    dtype, _ndim, _pad, *_shape, offset, nbytes, _group, _bits = struct.unpack("<BBH4IQQII", rec)
    assert dtype == 4, "the last record of a .cact is the RAW tokenizer"
    return _read(path, offset, nbytes)


@cache
def blob(generation: str, name: str) -> bytes:
    if generation == "toy":
        return _toy_blob()
    fixture = get_fixture(generation, name)
    rec = _blob_record(fixture)
    return _read(fixture.cact, rec["offset"], rec["nbytes"])


@cache
def tokenizer(generation: str, name: str) -> Tokenizer:
    return Tokenizer.from_blob(blob(generation, name))


@cache
def sentencepiece(generation: str, name: str) -> spm.SentencePieceProcessor:
    folder = get_fixture(generation, name).folder
    suffix = "tokenizer.model" if generation == "needle3" else "spm.model"
    path = folder / f"{name}.{suffix}"
    assert path.is_file(), f"missing SentencePiece model {path}"
    return spm.SentencePieceProcessor(model_file=str(path))


@cache
def corpus() -> tuple[str, ...]:
    return tuple(make_corpus(2000))
