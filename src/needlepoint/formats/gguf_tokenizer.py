"""The tokenizer stored in a GGUF file's metadata (`tokenizer.ggml.*`), as an `HFTokenizer`.

Built with the `tokenizers` library so that it tokenizes as llama.cpp does:

* `tokenizer.ggml.model = "gpt2"`: byte-level BPE from `tokens` and `merges`; the split before
  BPE follows `tokenizer.ggml.pre` as llama.cpp's `llama-vocab.cpp` does (GPT-2's regex; SmolLM
  / StarCoder-style: every digit alone, then GPT-2's regex; Llama 3 and Qwen 2 regexes).
* `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE from `tokens` and `scores` (a merge
  for every pair of pieces whose concatenation is a piece, ranked by that piece's score), spaces
  as U+2581 with a prefix space when `add_space_prefix`, `<0xNN>` byte fallback.

Token types (`token_type`): 3 (control) become special added tokens, 4 (user defined) plain
added tokens. BOS is prepended when `add_bos_token` (default: on for "llama", off for "gpt2").
The chat template is `tokenizer.chat_template`. Other tokenizer models or pre-tokenizer names
are a `TokenizerError`.
"""

from __future__ import annotations

from typing import Any

from ..errors import TokenizerError
from .hf_tokenizer import BYTE_LEVEL, METASPACE, SPACE, HFTokenizer

CONTROL, USER_DEFINED, BYTE = 3, 4, 6
_GPT2_REGEX = None  # ByteLevel(use_regex=True) is GPT-2's own regex
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva")
PRE_TOKENIZERS = ("default", "gpt2", *_DIGITS_THEN_GPT2, "llama3", "llama-bpe", "llama-v3",
                  "qwen2")


def _pre_tokenizer(tk: Any, pre: str) -> Any:
    byte_level = tk.pre_tokenizers.ByteLevel
    if pre in ("default", "gpt2"):
        return byte_level(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Digits(individual_digits=True),
                                           byte_level(add_prefix_space=False, use_regex=True)])
    regex = _QWEN2_REGEX if pre == "qwen2" else _LLAMA3_REGEX
    return tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(regex), behavior="isolated", invert=False),
        byte_level(add_prefix_space=False, use_regex=False),
    ])


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]
                ) -> list[tuple[str, str]]:
    """Merges of a score-ranked SentencePiece BPE vocabulary (highest-scoring result first)."""
    ids = {piece: i for i, piece in enumerate(tokens) if types[i] == 1}
    ranked = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], i, ids[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def tokenizer_from_gguf(checkpoint: Any) -> HFTokenizer:
    """The tokenizer of a `GGUFCheckpoint` (its `value(key)` reads the metadata)."""
    try:
        import tokenizers as tk
    except ImportError as error:  # pragma: no cover - the `hf` extra is not installed
        raise TokenizerError("GGUF tokenizers need `tokenizers`: pip install "
                             "'needlepoint[hf]'") from error
    name = checkpoint.path.name
    model = checkpoint.value("tokenizer.ggml.model")
    tokens = checkpoint.value("tokenizer.ggml.tokens")
    if not tokens:
        raise TokenizerError(f"{name}: no tokenizer.ggml.tokens in the GGUF metadata")
    types = checkpoint.value("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {piece: i for i, piece in enumerate(tokens)}
    if model == "gpt2":
        pre = checkpoint.value("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise TokenizerError(f"{name}: GGUF pre-tokenizer {pre!r} is not supported "
                                 f"(supported: {', '.join(PRE_TOKENIZERS)})")
        merges = [tuple(m.split(" ", 1)) for m in checkpoint.value("tokenizer.ggml.merges", [])]
        backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        backend.pre_tokenizer = _pre_tokenizer(tk, pre)
        backend.decoder = tk.decoders.ByteLevel()
        byte_mode, default_bos = BYTE_LEVEL, False
    elif model == "llama":
        scores = checkpoint.value("tokenizer.ggml.scores") or [0.0] * len(tokens)
        unk = checkpoint.value("tokenizer.ggml.unknown_token_id", 0)
        backend = tk.Tokenizer(tk.models.BPE(
            vocab=vocab, merges=_spm_merges(tokens, scores, types), unk_token=tokens[unk],
            fuse_unk=True, byte_fallback=True))
        prefix = checkpoint.value("tokenizer.ggml.add_space_prefix", True)
        backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False)
        backend.decoder = tk.decoders.Sequence([
            tk.decoders.Replace(SPACE, " "), tk.decoders.ByteFallback(), tk.decoders.Fuse(),
            *([tk.decoders.Strip(" ", 1, 0)] if prefix else []),
        ])
        byte_mode, default_bos = METASPACE, True
    else:
        raise TokenizerError(f"{name}: GGUF tokenizer model {model!r} is not supported "
                             f"(supported: gpt2, llama)")
    added = [tk.AddedToken(tokens[i], special=kind == CONTROL, normalized=False)
             for i, kind in enumerate(types) if kind in (CONTROL, USER_DEFINED)]
    backend.add_special_tokens([t for t in added if t.special])
    backend.add_tokens([t for t in added if not t.special])
    bos = checkpoint.value("tokenizer.ggml.bos_token_id")
    eos = checkpoint.value("tokenizer.ggml.eos_token_id")
    single = []
    if checkpoint.value("tokenizer.ggml.add_bos_token", default_bos) and bos is not None:
        single.append(tokens[bos])
    single.append("$A")
    if checkpoint.value("tokenizer.ggml.add_eos_token", False) and eos is not None:
        single.append(tokens[eos])
    if len(single) > 1:
        specials = [(tokens[i], i) for i in (bos, eos) if i is not None]
        backend.post_processor = tk.processors.TemplateProcessing(
            single=" ".join(single), special_tokens=sorted(set(specials)))
    special_names = {key: tokens[i] for key, i in (("bos_token", bos), ("eos_token", eos))
                     if isinstance(i, int) and 0 <= i < len(tokens)}
    tokenizer = HFTokenizer(backend, byte_mode=byte_mode, bos_id=bos, eos_id=eos,
                            chat_template=checkpoint.value("tokenizer.chat_template"),
                            special_tokens=special_names, source=name)
    return tokenizer
