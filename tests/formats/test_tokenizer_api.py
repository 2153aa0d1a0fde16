"""Tokenizer API details: piece-name lookalikes stay text, the encode layout, lookups and
token bytes, invalid UTF-8 replacement, rejected ids, and a realistic tool prompt.
Shared setup: `tokenizer_helpers.py`.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizer_corpus import TOOLS, render_prompt
from tokenizer_helpers import SPACE, blob, sentencepiece, tokenizer

from needlepoint.errors import TokenizerError
from needlepoint.formats.tokenizer import PieceType, Tokenizer


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

