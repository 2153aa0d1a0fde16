"""Tokenizer parity: the blob-built encoder against every fixture's stored prompt ids, against
SentencePiece (the models the blobs were made from) on a 2,000-string corpus, round trips,
the toy model's prompts, and models trained or built with other options.
Shared setup: `tokenizer_helpers.py`.
"""

from __future__ import annotations

import io
import json
import struct

import pytest
import sentencepiece as spm
from conftest import get_fixture, toy_model_path
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_corpus import MARKERS, TOOLS, make_corpus, render_prompt
from tokenizer_helpers import ALL, FIXTURES, SPACE, blob, corpus, sentencepiece, tokenizer

from needlepoint.formats.tokenizer import PieceType, Tokenizer


# ---------------------------------------------------------------- ground-truth ids
def _sidecar_prompts(generation: str, name: str, array: str, key: str) -> list[tuple]:
    """Each sidecar prompt with its ground-truth ids (array `p{k}_{array}`), after checking
    there are prompts and that the JSON's copy (`key`) equals the array."""
    fixture = get_fixture(generation, name)
    assert fixture.meta["prompts"], "no prompts in sidecar"
    out = []
    for k, prompt in enumerate(fixture.meta["prompts"]):
        expected = fixture.arrays[f"p{k}_{array}"].tolist()
        assert prompt[key] == expected
        out.append((prompt, expected))
    return out


@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_needle3_prompt_ids(name):
    tok = tokenizer("needle3", name)
    for prompt, expected in _sidecar_prompts("needle3", name, "tokens", "token_ids"):
        ids = [tok.bos_id, *tok.encode(prompt["text"])]
        if prompt["target"] is not None:  # "[BOS] + encode(text) + encode(target) + [EOS]"
            ids += [*tok.encode(prompt["target"]), tok.eos_id]
        assert ids == expected, prompt["name"]


@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_needle2_prompt_ids(name):
    tok = tokenizer("needle2", name)
    for prompt, expected in _sidecar_prompts("needle2", name, "ids", "ids"):
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

