"""Tokenizer parity: the blob-built encoder against every fixture's stored prompt ids, against
SentencePiece (the models the blobs were made from) on a 2,000-string corpus, round trips,
and corrupt blobs. Spec: needle3 README "Tokenizer blob (RAW)" / "Tokenizer", needle2 README
"Tokenizer blob" / "Tokenizer and special ids".
"""

from __future__ import annotations

import io
import json
import random
import struct
from functools import cache

import numpy as np
import pytest
import sentencepiece as spm
from conftest import get_fixture, toy_model_path
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_corpus import MARKERS, TOOLS, make_corpus, render_prompt

from needlepoint.errors import TokenizerError
from needlepoint.tokenizer import PieceType, Tokenizer

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
    from needlepoint.cact import open_archive

    for gen, name in ALL:
        path = toy_model_path() if gen == "toy" else get_fixture(gen, name).cact
        archive = open_archive(path)
        try:
            assert bytes(archive.tokenizer_blob) == blob(gen, name), (gen, name)
        finally:
            if hasattr(archive, "close"):
                archive.close()


# ---------------------------------------------------------------- ground-truth ids
@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_needle3_prompt_ids(name):
    fixture, tok = get_fixture("needle3", name), tokenizer("needle3", name)
    assert fixture.meta["prompts"], "no prompts in sidecar"
    for i, prompt in enumerate(fixture.meta["prompts"]):
        expected = fixture.arrays[f"p{i}_tokens"].tolist()
        assert prompt["token_ids"] == expected
        ids = [tok.bos_id, *tok.encode(prompt["text"])]
        if prompt["target"] is not None:  # "[BOS] + encode(text) + encode(target) + [EOS]"
            ids += [*tok.encode(prompt["target"]), tok.eos_id]
        assert ids == expected, prompt["name"]


@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_needle2_prompt_ids(name):
    fixture, tok = get_fixture("needle2", name), tokenizer("needle2", name)
    assert fixture.meta["prompts"], "no prompts in sidecar"
    for k, prompt in enumerate(fixture.meta["prompts"]):
        expected = fixture.arrays[f"p{k}_ids"].tolist()
        assert prompt["ids"] == expected
        assert [tok.bos_id, *tok.encode(prompt["text"])] == expected, prompt["kind"]
        if "query" in prompt:  # the JSON's text is upstream's rendering of query + tools
            rendered = render_prompt(prompt["query"], prompt["tools"], prompt.get("system", ""))
            assert rendered == prompt["text"]


@pytest.mark.parametrize("gen,name", FIXTURES)
def test_greedy_text_decodes(gen, name):
    """The continuations' stored text (upstream SentencePiece decode, invalid bytes and all)."""
    fixture, tok = get_fixture(gen, name), tokenizer(gen, name)
    checked = 0
    if gen == "needle3":
        for mode, texts in fixture.meta["greedy_text"].items():
            for i, text in enumerate(texts):
                assert tok.decode(fixture.arrays[f"p{i}_greedy_{mode}"]) == text
                checked += 1
    else:
        for prompt in fixture.meta["prompts"]:
            assert tok.decode(prompt["gen_ids"]) == prompt["gen_text"]
            checked += 1
    assert checked >= 2


# ---------------------------------------------------------------- corpus parity
@pytest.mark.parametrize("gen,name", FIXTURES)
def test_corpus_matches_sentencepiece(gen, name):
    tok, sp = tokenizer(gen, name), sentencepiece(gen, name)
    texts = corpus()
    assert len(texts) >= 2000
    for text, expected in zip(texts, sp.encode(list(texts)), strict=True):
        ids = tok.encode(text)
        assert ids == expected, text
        assert tok.decode(ids) == sp.decode(ids), text


@pytest.mark.parametrize("gen,name", ALL)
def test_corpus_round_trip(gen, name):
    """decode(encode(s)) == s, leading spaces included (the dummy prefix is the only space
    decode drops); a literal U+2581 in the input is indistinguishable from a space."""
    tok = tokenizer(gen, name)
    for text in corpus():
        ids = tok.encode(text)
        assert tok.decode(ids) == text.replace(SPACE, " "), text
        assert tok.decode_bytes(ids) == text.replace(SPACE, " ").encode("utf-8")
        kinds = set(tok.types[ids].tolist()) if ids else set()
        assert not kinds & {PieceType.CONTROL, PieceType.UNKNOWN}, text


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80))
def test_hypothesis_round_trip_and_sentencepiece(text):
    tok, sp = tokenizer("needle3", "tiny"), sentencepiece("needle3", "tiny")
    ids = tok.encode(text)
    assert tok.decode(ids) == text.replace(SPACE, " ")
    assert ids == sp.encode(text)


def test_toy_model_tokenizer():
    """No SentencePiece model ships with the toy: check layout, round trip and stability on
    every held-out prompt, and that each fits the toy's 512-token context with room to answer."""
    tok = tokenizer("toy", "needle3-toy")
    assert tok.vocab_size == 1024 and tok.markers == {m: 4 + i for i, m in enumerate(MARKERS)}
    fresh = Tokenizer.from_blob(memoryview(blob("toy", "needle3-toy")))
    eval_path = toy_model_path().with_name("needle3-toy.eval.jsonl")
    rows = [json.loads(line) for line in eval_path.read_text().splitlines() if line.strip()]
    assert len(rows) == 300
    for row in rows:
        prompt = render_prompt(row["query"], row["tools"])
        ids = tok.encode(prompt)
        assert ids[:2] == [tok.piece_to_id(SPACE), tok.marker_id("<|im_start|>")]
        assert ids == fresh.encode(prompt) == tok.encode(prompt)
        assert tok.decode(ids) == prompt
        assert len(ids) + 1 + 80 <= 512
        target = "<tool_call>" + json.dumps(row["answers"], separators=(",", ":")) + "</tool_call>"
        assert tok.decode(tok.encode(target + "<|im_end|>")) == target + "<|im_end|>"


# ---------------------------------------------------------------- other tokenizer options
def _blob_from_sentencepiece(sp: spm.SentencePieceProcessor, dummy: bool, fallback: bool) -> bytes:
    """The archive blob written from a SentencePiece model (as upstream's exporter does)."""
    out = [struct.pack("<5IBBH", sp.get_piece_size(), 0, 1, 2, 3, dummy, fallback, 0)]
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        kind = (PieceType.UNKNOWN if sp.is_unknown(i) else PieceType.CONTROL if sp.is_control(i)
                else PieceType.BYTE if sp.is_byte(i)
                else PieceType.USER_DEFINED if piece in MARKERS else PieceType.NORMAL)
        text = piece.encode("utf-8")
        out.append(struct.pack("<fBH", sp.get_score(i), kind, len(text)) + text)
    return b"".join(out)


@pytest.mark.parametrize("dummy,fallback", [(False, True), (True, False), (False, False)])
def test_other_options_match_sentencepiece(dummy, fallback):
    """The fixtures all use dummy prefix + byte fallback; train small models without them
    (ASCII training text, so the corpus hits unknown characters) and compare."""
    lines = [render_prompt(q, [tool]) for tool in TOOLS for q in ("set it", "weather in Paris?")]
    lines += [s for s in make_corpus(300, seed=7) if s.isascii() and s.strip()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="bpe",
        vocab_size=700 if fallback else 300, character_coverage=1.0, byte_fallback=fallback,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, user_defined_symbols=list(MARKERS[:10]),
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=dummy, num_threads=1, hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    tok = Tokenizer.from_blob(_blob_from_sentencepiece(sp, dummy, fallback))
    unknown_seen = 0
    for text in corpus()[:800]:
        ids = tok.encode(text)
        assert ids == sp.encode(text), text
        if tok.unk_id in ids:  # SentencePiece decodes UNK as " \u2047 "; the README skips it
            unknown_seen += 1
            assert all(a != b or a != tok.unk_id for a, b in zip(ids, ids[1:], strict=False))
        else:
            assert tok.decode(ids) == sp.decode(ids) == text.replace(SPACE, " "), text
    assert (unknown_seen > 0) == (not fallback)


def _proto_piece(piece: str, score: float, proto_type: int) -> bytes:
    """One serialized `ModelProto.pieces` entry (field 1: piece, 2: score, 3: type). Appending
    it to a serialized model appends a piece (protobuf concatenation merges repeated fields)."""
    text = piece.encode("utf-8")
    inner = b"\x0a" + bytes([len(text)]) + text + b"\x15" + struct.pack("<f", score)
    inner += b"\x18" + bytes([proto_type])
    return b"\x0a" + bytes([len(inner)]) + inner


def test_synthetic_pieces_match_sentencepiece():
    """Vocabularies the trainer never makes, to pin the two rules the fixtures cannot:
    merges never produce CONTROL/UNKNOWN/BYTE pieces even when NORMAL pieces lead up to
    them (`<s` + `>` stays two pieces), and the longest USER_DEFINED piece wins."""
    folder = get_fixture("needle3", "tiny").folder
    base = (folder / "tiny.tokenizer.model").read_bytes()
    normal, user = 1, 4  # ModelProto.SentencePiece.Type numbering, not the blob's
    extra = [("<s", 5.0, normal), ("<0", 5.0, normal), ("<0x", 5.0, normal),
             ("<0x4", 5.0, normal), ("<0x41", 5.0, normal), ("<un", 5.0, normal),
             ("k>", 5.0, normal), ("<|", 5.0, normal), ("<|im", 5.0, normal),
             ("<tool_call>x", 0.0, user), ("<tool_call>xy", 0.0, user)]
    sp = spm.SentencePieceProcessor(model_proto=base + b"".join(_proto_piece(*e) for e in extra))
    head = bytearray(blob("needle3", "tiny"))
    struct.pack_into("<I", head, 0, sp.get_piece_size())
    tail = [struct.pack("<fBH", score, 0 if kind == normal else PieceType.USER_DEFINED,
                        len(p.encode())) + p.encode() for p, score, kind in extra]
    tok = Tokenizer.from_blob(bytes(head) + b"".join(tail))
    texts = ["<s>", "<0x41>", "<unk>", "a<unk>b<s></s>", "<|im", "<|im_start|>", "<tool_call>x",
             "<tool_call>xyz", "<tool_call>", " <tool_call>xy<tool_call>x", *corpus()[:500]]
    for text in texts:
        ids = tok.encode(text)
        assert ids == sp.encode(text), text
        assert tok.decode(ids) == sp.decode(ids) == text.replace(SPACE, " "), text
    assert tok.encode("<s>")[1:] == [tok.piece_to_id("<s"), tok.piece_to_id(">")]
    assert tok.encode("<tool_call>xyz")[1] == tok.marker_id("<tool_call>xy")


# ---------------------------------------------------------------- API details
def test_piece_name_lookalikes_stay_text():
    """SentencePiece keeps CONTROL/BYTE/UNKNOWN pieces out of BPE: `<s>` in text is not BOS."""
    tok = tokenizer("needle3", "small")
    for text in ("<s>", "</s>", "<pad>", "<unk>", "<0x41>", "a<s>b</s>"):
        ids = tok.encode(text)
        assert not {tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id} & set(ids)
        assert tok.piece_to_id("<0x41>") not in ids
        assert tok.decode(ids) == text


def test_encode_layout():
    tok = tokenizer("needle3", "tiny")
    space = tok.piece_to_id(SPACE)
    assert tok.encode("") == []
    assert tok.encode("<|im_start|>") == [space, 4]
    assert tok.encode("<|im_end|><|im_start|>") == [space, 5, 4]
    assert tok.encode("\n") == [space, tok.piece_to_id("<0x0A>")]  # README: "\n" is byte 0x0A
    assert tok.encode(" ") == [space, space]
    assert tok.decode([tok.bos_id, space, space, tok.eos_id]) == " "
    assert tok.decode([]) == "" and tok.decode_bytes([]) == b""


def test_lookups_and_token_bytes():
    tok = tokenizer("needle2", "small")
    table = tok.all_token_bytes()
    assert len(table) == tok.vocab_size
    for i, piece in enumerate(tok.pieces):
        assert tok.piece_to_id(piece) == i and tok.id_to_piece(i) == piece
        assert tok.token_bytes(i) == table[i]
    assert tok.token_bytes(tok.bos_id) == b"" and tok.token_bytes(tok.unk_id) == b""
    assert tok.token_bytes(tok.piece_to_id(SPACE)) == b" "
    assert tok.token_bytes(tok.marker_id("<tool_call>")) == b"<tool_call>"
    text = 'x  <tool_call>[{"name":"é😀"}]</tool_call>'
    ids = tok.encode(text)
    assert b"".join(table[i] for i in ids) == b" " + text.encode("utf-8")  # dummy-prefix space
    table[0] = b"mutated"
    assert tok.token_bytes(0) == b""
    with pytest.raises(TokenizerError, match="<nope>"):
        tok.marker_id("<nope>")
    with pytest.raises(KeyError):
        tok.piece_to_id("definitely not a piece")


def test_invalid_utf8_replacement_matches_sentencepiece():
    """Byte pieces that do not form UTF-8 give one U+FFFD per byte, like SentencePiece."""
    tok, sp = tokenizer("needle3", "tiny"), sentencepiece("needle3", "tiny")
    first_byte = tok.piece_to_id("<0x00>")
    rng = random.Random(3)
    normal = [i for i in range(tok.vocab_size) if tok.types[i] == PieceType.NORMAL]
    for _ in range(300):
        ids = [rng.choice(normal)] + [
            first_byte + rng.choice([0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0xC3, 0xA9, 0x41, 0xFF, 0xED])
            if rng.random() < 0.7 else rng.choice(normal) for _ in range(rng.randint(1, 12))]
        assert tok.decode(ids) == sp.decode(ids), ids
    assert tok.decode([first_byte + 0xE2, first_byte + 0x82]) == "\ufffd\ufffd"


@pytest.mark.parametrize("bad", [-1, 1024, 10**12, 1.5, "7", None])
def test_decode_rejects_unknown_ids(bad):
    tok = tokenizer("needle3", "tiny")
    with pytest.raises(TokenizerError, match=str(bad) if bad is not None else "None"):
        tok.decode([5, bad])
    with pytest.raises(TokenizerError):
        tok.token_bytes(bad)
    with pytest.raises(TokenizerError):
        tok.id_to_piece(bad)
    assert tok.decode(np.array([2, 953], np.int64)) == ""


def test_long_tool_prompt_matches_sentencepiece():
    """A ~2,000-character tool prompt (the realistic size) encodes as sentencepiece does.

    Speed is measured in bench/, not asserted here.
    """
    tools = [dict(t, name=f"{t['name']}_{k}") for k in range(2) for t in TOOLS]
    prompt = render_prompt("please wake me up at 06:45 and tell Ana “I'm late” 😀", tools,
                           "date: 2026-07-21 Tue 14:30; locale: en-US")
    assert 1800 <= len(prompt) <= 2600
    tok = Tokenizer.from_blob(blob("needle3", "shipped"))  # fresh: empty chunk cache
    ids = tok.encode(prompt)
    assert ids == sentencepiece("needle3", "shipped").encode(prompt)
    assert tok.decode(ids) == prompt


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
