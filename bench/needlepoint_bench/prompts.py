"""Benchmark prompts, as both engines must see them: the same token ids.

needle-rs takes `(query, tools_json, system)` and renders the upstream wire format itself
(`shared/fixtures/needle3/README.md`, "Prompt wire format"):

    [<|im_start|>system\\n{system}<|im_end|>\\n]
    <|im_start|>user\\n<tools>{tools_json}</tools>\\n{query}<|im_end|>\\n<|im_start|>assistant\\n

and feeds `[BOS] + encode(that string)`. needlepoint is fed exactly those ids, computed here
with the archive's own tokenizer. needle-rs passes `tools_json` through verbatim (it does not
parse it), so the shortest prompt it can express is 13 tokens (empty tools and query). Every
run checks needle-rs's reported prompt length (`positions - len(token_ids)`) against
`len(ids)` and records the result.

Fixed-length prompts use `tools_json = "[]"` and a query of plain English words topped up with
one-token fillers until the count is exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOOLS = [
    {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "name": "set_alarm",
        "description": "Set an alarm.",
        "parameters": {
            "type": "object",
            "properties": {"time": {"type": "string"}},
            "required": ["time"],
        },
    },
]
TOOL_QUERY = "Wake me at 6:45 and tell me if I need an umbrella in Lagos."
TOOL_PROMPT_NAME = "tool"

# Prose used to pad queries to a length: ordinary words, so BPE behaves as on real text.
_FILL_TEXT = (
    "please check my calendar for tomorrow and remind me about the meeting with the design "
    "team then find a quiet place for lunch near the office and send a short note to my "
    "sister saying that I will call her after work because the train is late again and the "
    "weather looks like rain so I might need a taxi home before the shop closes at seven "
    "when you have a moment also look up the opening hours of the library and book two "
    "seats for the concert on friday evening if there are any left near the front"
).split()
_ONE_TOKEN_FILLERS = ("a", "I", "x", "1", ".")


def tools_json(tools: list[dict]) -> str:
    return json.dumps(tools, separators=(",", ":"), ensure_ascii=False)


def render(query: str, tools: str, system: str | None = None) -> str:
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return (
        head + f"<|im_start|>user\n<tools>{tools}</tools>\n{query}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@dataclass
class Prompt:
    name: str
    query: str
    tools_json: str
    system: str | None
    ids: list[int] = field(repr=False)

    @property
    def length(self) -> int:
        return len(self.ids)

    def to_json(self) -> dict:
        d = asdict(self)
        d["length"] = self.length
        return d

    @classmethod
    def from_json(cls, d: dict) -> Prompt:
        return cls(d["name"], d["query"], d["tools_json"], d["system"], list(d["ids"]))


Encoder = Callable[[str], list[int]]


def make_encoder(archive: Path) -> tuple[Encoder, str]:
    """`text -> [BOS] + ids`: the archive's tokenizer (needlepoint), else SentencePiece on the
    fixture's `<name>.tokenizer.model` (the same pieces; README "How they were made")."""
    errors = []
    try:
        from needlepoint import open_archive

        tok = open_archive(archive).tokenizer
        bos = int(tok.bos_id)
        tok.encode("probe")
        return (lambda text: [bos] + list(tok.encode(text))), "needlepoint archive tokenizer"
    except Exception as exc:  # noqa: BLE001 - reported, then the fallback is tried
        errors.append(f"needlepoint tokenizer: {type(exc).__name__}: {exc}")
    spm = archive.with_suffix(".tokenizer.model")
    try:
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
        bos = sp.bos_id()
        return (lambda text: [bos] + list(sp.encode(text))), f"sentencepiece {spm.name}"
    except Exception as exc:  # noqa: BLE001
        errors.append(f"sentencepiece: {type(exc).__name__}: {exc}")
    raise RuntimeError("no tokenizer available to build prompts: " + "; ".join(errors))


def exact_length_prompt(encode: Encoder, n: int, name: str | None = None) -> Prompt:
    """A `tools_json="[]"` prompt of exactly `n` token ids (BOS included)."""
    tools = "[]"

    def count(words: list[str]) -> int:
        return len(encode(render(" ".join(words), tools)))

    base = count([])
    if n < base:
        raise ValueError(f"shortest expressible prompt is {base} tokens, asked for {n}")
    words: list[str] = []
    k = 0
    while count(words) < n:
        words.append(_FILL_TEXT[k % len(_FILL_TEXT)])
        k += 1
    while count(words) > n:  # overshoot by a multi-token word: drop it and top up
        words.pop()
    while count(words) < n:
        for filler in _ONE_TOKEN_FILLERS:
            if count(words + [filler]) == count(words) + 1:
                words.append(filler)
                break
        else:
            raise RuntimeError(f"cannot reach exactly {n} tokens (stuck at {count(words)})")
    query = " ".join(words)
    ids = encode(render(query, tools))
    assert len(ids) == n
    return Prompt(name or f"len{n}", query, tools, None, ids)


def tool_prompt(encode: Encoder) -> Prompt:
    """The ~100-token tool-calling prompt: two tools and a natural query, as an app sends it."""
    tj = tools_json(TOOLS)
    return Prompt(TOOL_PROMPT_NAME, TOOL_QUERY, tj, None, encode(render(TOOL_QUERY, tj)))


def build_prompts(archive: Path, lengths: list[int]) -> tuple[list[Prompt], str]:
    encode, source = make_encoder(archive)
    prompts = [exact_length_prompt(encode, n) for n in lengths]
    prompts.append(tool_prompt(encode))
    return prompts, source
