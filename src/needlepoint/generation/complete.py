"""Plain-text continuation on any model, base models included (no chat template, no tools):
the prompt's ids (the tokenizer's special tokens added, e.g. Gemma's BOS), then one token at a
time, greedy or sampled, until EOS or `max_new_tokens`, as text pieces while they decode
(UTF-8 split across tokens is held until whole). What `needlepoint run --raw` streams.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from .sampling import SamplingConfig, choose_token, resolve_seed


def continue_text(model: Any, text: str, *, max_new_tokens: int = 128,
                  sampling: SamplingConfig | None = None) -> Iterator[str]:
    """The continuation of `text` by `model`, piece by piece."""
    from .turn import checked

    tokenizer = model.tokenizer
    sampling = sampling or SamplingConfig()
    seed = resolve_seed(sampling.seed)
    ids = list(tokenizer.encode(text))
    pieces = tokenizer.all_token_bytes()
    stops = {t for t in (tokenizer.eos_id,) if t is not None}
    session = model.session()
    logits = checked(session.prefill(ids, logits=True), "prefill", len(ids))
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    limit = int(model.config.max_seq_len)
    for k in range(max_new_tokens):
        position = len(ids) + k
        token = choose_token(logits, sampling, position=position, seed=seed,
                             allowed=None)
        if token in stops:
            break
        piece = utf8.decode(pieces[token] if token < len(pieces) else b"")
        if piece:
            yield piece
        if position + 1 >= limit or k + 1 >= max_new_tokens:
            break
        logits = checked(session.step(token), "decode step", position + 1)
    tail = utf8.decode(b"", final=True)
    if tail:
        yield tail


__all__ = ["continue_text"]
