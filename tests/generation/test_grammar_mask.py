"""Tool-call grammar (needlepoint.grammar): the token mask and the vocabulary. Forced text
and canonical twins, forced-token fast-forward, a vocabulary without an encoder, logits
masking and matcher independence, `TokenVocab.from_tokenizer` on the archives, and the cost
of a mask. Shared setup: `grammar_helpers.py`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import sentencepiece as spm
from conftest import fixtures_dir, get_fixture
from grammar_helpers import (
    CLOSE,
    EOS,
    IM_END,
    OPEN,
    TOOLS,
    VALID,
    encode,
    grammar,
    sp,
    sp_vocab,
    vocab,
    walk,
)

from needlepoint.errors import TokenizerError
from needlepoint.formats.cact import open_archive
from needlepoint.generation.grammar import GrammarError, TokenVocab, ToolCallGrammar


def test_vocab_without_encoder_and_bad_ids():
    token_bytes, special = sp_vocab(sp())
    v = TokenVocab(token_bytes, special, EOS, (CLOSE, IM_END))  # greedy stands in for encode
    m = walk(encode('[{"name":"set_'), ToolCallGrammar(v, TOOLS))
    forced = m.forced_tokens()
    assert b'alarm","arguments":{"time":"'.startswith(b"".join(token_bytes[t] for t in forced))
    for t in forced:
        m.advance(t)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        TokenVocab(token_bytes, special, len(token_bytes))
    with pytest.raises(TokenizerError, match="must be special"):
        TokenVocab(token_bytes, special, EOS, (300,))


def test_mask_keeps_forced_text_and_twins_canonical():
    m = walk(encode('[{"'))
    name, n = encode("name"), encode("n")
    assert len(name) == 1 and np.flatnonzero(m.allowed_mask()).tolist() == name
    m.advance(n[0])  # a non-canonical spelling of forced text is still valid text
    m = walk(encode('[{"name":"get_weather","arguments":{"city":"'))
    quote, twin = encode('"')[0], sp().piece_to_id("<0x22>")
    mask = m.allowed_mask()
    assert quote != twin and mask[quote] and not mask[twin]
    assert twin in vocab().twin_ids.tolist()
    m.advance(twin)


def test_forced_tokens_fast_forward_canonically():
    m = walk(encode('[{"name":"set_'))
    forced = m.forced_tokens()
    text = b"".join(vocab().token_bytes[t] for t in forced)
    assert text and b'alarm","arguments":{"time":"'.startswith(text)
    assert forced == encode(text.decode()), "forced ids are the tokenizer's own encoding"
    for t in forced:
        m.advance(t)
    # `[` is forced but not yet a token: it may merge into `[{"` or `[]`
    assert grammar().start().forced_tokens() == []



def test_mask_logits_and_matcher_independence():
    g = grammar()
    a, b = g.start(), g.start()
    a.advance(encode("[")[0])
    assert b.allowed_mask()[encode("[")[0]] and not b.tokens
    logits = np.zeros(vocab().vocab_size + 5, np.float32)
    a.mask_logits(logits)
    assert np.isneginf(logits[vocab().vocab_size:]).all()
    assert np.array_equal(np.isfinite(logits[: vocab().vocab_size]), a.allowed_mask())
    with pytest.raises(GrammarError, match="logits shape"):
        a.mask_logits(np.zeros(10, np.float32))
    with pytest.raises(GrammarError, match="outside the vocabulary"):
        a.advance(vocab().vocab_size)
    with pytest.raises(GrammarError, match="not complete"):
        a.calls()


@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_vocab_from_archive_tokenizer(name):
    tokenizer = open_archive(get_fixture("needle3", name).cact).tokenizer
    v = TokenVocab.from_tokenizer(tokenizer)
    model = spm.SentencePieceProcessor(
        model_file=str(fixtures_dir("needle3") / f"{name}.tokenizer.model"))
    token_bytes, special = sp_vocab(model)
    never_text = {i for i, b in enumerate(token_bytes) if b[:1] == b"\xff"}  # not UTF-8
    assert v.token_bytes == token_bytes and v.special_ids == frozenset(special) | never_text
    assert (v.eos_id, v.end_ids) == (EOS, (CLOSE, IM_END))
    g = ToolCallGrammar(v, TOOLS)
    text = VALID[-1]
    ids = model.encode("<tool_call>" + text)
    m = g.start()
    for t in ids[ids.index(OPEN) + 1 :] + [CLOSE, IM_END]:
        m.advance(t)
    assert m.is_finished() and m.calls() == json.loads(text)
