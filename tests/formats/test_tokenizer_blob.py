"""Tokenizer blob format: the header and piece records parse exactly, special ids and
markers match the sidecars, the pieces match the SentencePiece models, the archive reader
returns the same bytes, and corrupt blobs raise TokenizerError.
Shared setup: `tokenizer_helpers.py`.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from conftest import get_fixture, toy_model_path
from tokenizer_helpers import ALL, FIXTURES, blob, sentencepiece, tokenizer

from needlepoint.errors import TokenizerError
from needlepoint.formats.tokenizer import PieceType, Tokenizer


# ---------------------------------------------------------------- the blob itself
@pytest.mark.parametrize("gen,name", ALL)
def test_blob_header_is_24_bytes_and_parses_exactly(gen, name):
    data = blob(gen, name)
    n_pieces, pad, eos, bos, unk, dummy, fallback, _ = struct.unpack_from("<5IBBH", data)
    off = 24  # not 20 (needle3 README typo): 5 u32 + u8 + u8 + u16
    for _ in range(n_pieces):
        off += 7 + struct.unpack_from("<H", data, off + 5)[0]
    assert off == len(data)
    tok = tokenizer(gen, name)
    assert (tok.vocab_size, tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (
        n_pieces, pad, eos, bos, unk)
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.add_dummy_prefix is True and tok.byte_fallback is True
    assert [tok.pieces[i] for i in range(4)] == ["<pad>", "</s>", "<s>", "<unk>"]
    assert tok.scores.dtype == np.float32 and tok.types.dtype == np.uint8
    assert len(tok.pieces) == len(tok.scores) == len(tok.types) == tok.vocab_size


@pytest.mark.parametrize("gen,name", FIXTURES)
def test_special_ids_and_markers_match_sidecar(gen, name):
    tok = tokenizer(gen, name)
    meta = get_fixture(gen, name).meta["tokenizer"]
    if gen == "needle3":
        assert meta["pieces"] == tok.vocab_size
        assert [meta[k] for k in ("pad_id", "eos_id", "bos_id", "unk_id")] == [0, 1, 2, 3]
        assert (meta["add_dummy_prefix"], meta["byte_fallback"]) == (True, True)
        markers = meta["markers"]
    else:
        assert meta["special_ids"] == {"pad": 0, "eos": 1, "bos": 2, "unk": 3}
        assert meta["blob_flags"] == {"add_dummy_prefix": True, "byte_fallback": True}
        markers = meta["chat_markers"]
    assert tok.markers == markers
    assert list(markers.values()) == list(range(4, 4 + len(markers)))
    first_byte = 4 + len(markers)  # needle3: 20..275, needle2: 14..269
    for b in range(256):
        assert tok.id_to_piece(first_byte + b) == f"<0x{b:02X}>"
        assert tok.types[first_byte + b] == PieceType.BYTE
        assert tok.token_bytes(first_byte + b) == bytes([b])
    assert tok.marker_id("<tool_call>") == 10 and tok.marker_id("<|im_start|>") == 4


@pytest.mark.parametrize("gen,name", FIXTURES)
def test_blob_matches_sentencepiece_model(gen, name):
    tok, sp = tokenizer(gen, name), sentencepiece(gen, name)
    assert sp.get_piece_size() == tok.vocab_size
    for i in range(tok.vocab_size):
        assert sp.id_to_piece(i) == tok.pieces[i]
        assert sp.get_score(i) == tok.scores[i]
        kind = PieceType(int(tok.types[i]))
        assert sp.is_control(i) == (kind == PieceType.CONTROL)
        assert sp.is_unknown(i) == (kind == PieceType.UNKNOWN)
        assert sp.is_byte(i) == (kind == PieceType.BYTE)


def test_archive_reader_returns_same_blob():
    """The archive reader's tokenizer blob is exactly the sidecar's bytes."""
    from needlepoint.formats.cact import open_archive

    for gen, name in ALL:
        path = toy_model_path() if gen == "toy" else get_fixture(gen, name).cact
        archive = open_archive(path)
        try:
            assert bytes(archive.tokenizer_blob) == blob(gen, name), (gen, name)
        finally:
            if hasattr(archive, "close"):
                archive.close()


# ---------------------------------------------------------------- corrupt blobs
def _patched(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _expect_error(data, match: str | None = None) -> None:
    with pytest.raises(TokenizerError, match=match):
        Tokenizer.from_blob(data)


def test_truncated_blobs():
    data = blob("needle2", "tiny")
    cuts = set(range(0, 40)) | set(random.Random(1).sample(range(40, len(data)), 150))
    cuts |= {len(data) - 1, len(data) - 2}
    for cut in sorted(cuts):
        _expect_error(data[:cut])
    _expect_error(b"", match="offset 0")


def test_bad_header_fields():
    data = blob("needle2", "tiny")
    n = struct.unpack_from("<I", data)[0]
    _expect_error(_patched(data, 0, "<I", 0), match="n_pieces")
    _expect_error(_patched(data, 0, "<I", 0xFFFFFFFF), match="n_pieces")
    _expect_error(_patched(data, 0, "<I", n + 1), match="piece")  # runs off the end
    _expect_error(_patched(data, 0, "<I", n - 1), match="trailing")
    _expect_error(data + b"\0", match="trailing")
    _expect_error(_patched(data, 12, "<I", n), match=r"bos_id \(offset 12\)")
    _expect_error(_patched(data, 16, "<I", 1 << 31), match=r"unk_id \(offset 16\)")
    _expect_error(_patched(data, 20, "<B", 2), match=r"add_dummy_prefix \(offset 20\)")
    _expect_error(_patched(data, 21, "<B", 7), match=r"byte_fallback \(offset 21\)")


def test_bad_piece_records():
    data = blob("needle2", "tiny")
    off0 = 24  # piece 0: "<pad>"
    _expect_error(_patched(data, off0 + 5, "<H", 0xFFFF), match=r"piece 0 \(offset 24\)")
    _expect_error(_patched(data, off0 + 5, "<H", 0), match="piece 0")
    _expect_error(_patched(data, off0 + 4, "<B", 9), match="type 9")
    _expect_error(_patched(data, off0, "<f", float("nan")), match="NaN")
    bad_utf8 = bytearray(data)
    bad_utf8[off0 + 7] = 0xFF
    _expect_error(bytes(bad_utf8), match="not UTF-8")
    dup = data.replace(b"\x05\x00<pad>", b"\x04\x00</s>", 1)  # piece 0 renamed to piece 1
    _expect_error(dup, match="duplicates")
    byte_name = data.replace(b"<0x41>", b"<0xG1>", 1)
    _expect_error(byte_name, match="not <0xNN>")
    _expect_error(data.replace(b"\x04\x06\x00<0x41>", b"\x00\x06\x00<0x41>", 1), match="256")


def test_garbage_and_mutations_raise_only_tokenizer_error():
    rng = random.Random(99)
    data = blob("needle2", "tiny")
    for _ in range(60):
        garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        _expect_error(garbage)
        _expect_error(data[:24] + garbage)
    for _ in range(250):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            tok = Tokenizer.from_blob(mutated)
        except TokenizerError:
            continue
        tok.decode(tok.encode("hello <tool_call> wörld 😀"))  # parses -> must still work
