"""Seeded text corpus for the tokenizer tests: the odd corners a chat prompt can hit.

Mixes wire-format tool prompts (needle3 README "Prompt wire format"), JSON, unicode from many
scripts (CJK, emoji with ZWJ/skin tones/flags, combining accents, RTL, astral planes),
whitespace runs (leading/trailing spaces, tabs, newlines, CR, NBSP, ideographic space),
control characters, chat markers (whole, partial, nested) and strings that look like piece
names (`<s>`, `<0x41>`, `<unk>`). No lone surrogates: a Python `str` from user text has none.
"""

from __future__ import annotations

import json
import random

MARKERS = (
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>", "<tool_call>",
    "</tool_call>", "<tool_result>", "</tool_result>", "<context>", "</context>", "<extract>",
    "</extract>", "<schema>", "</schema>",
)
LOOKALIKES = (
    "<s>", "</s>", "<pad>", "<unk>", "<0x41>", "<0x0A>", "<0xFF>", "<0xZZ>", "<0x>", "▁",
    "<|im_start", "im_end|>", "<tool_call", "</tool_call>>", "<<think>>", "<tools></tools>",
    "<|im_end|>\n",
)
WORDS = (
    "the", "weather", "set", "alarm", "timer", "minutes", "city", "Paris", "name", "description",
    "parameters", "type", "object", "string", "integer", "required", "properties", "enum",
    "brightness", "kitchen", "lights", "on", "off", "today", "tomorrow", "06:45", "12", "3.5",
    "-7", "1e9", "0x1F", "café", "naïve", "résumé", "Zürich", "São", "Москва", "東京", "北京市",
    "こんにちは", "안녕하세요", "مرحبا", "שלום", "नमस्ते", "Ελλάδα", "ﬁ", "Å", "e\u0301",
    "😀", "👍🏽", "👨\u200d👩\u200d👧", "🇨🇭", "𝕏", "𐍈", "\u200b", "\ufeff", "\ufffd", "½", "™", "€",
    "—", "“quotes”",
)
SPACES = (
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\x0b",
)
RANGES = (
    (0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
    (0x900, 0x97F), (0x300, 0x36F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
    (0x2000, 0x206F), (0x2190, 0x22FF), (0x2500, 0x25FF), (0xE000, 0xE0FF), (0xFF00, 0xFFEF),
    (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF), (0x10000, 0x1007F), (0x1D400, 0x1D4FF),
)
TOOLS = (
    {"name": "get_weather", "description": "Get the current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}},
    {"name": "set_alarm", "description": "Set an alarm for a time.",
     "parameters": {"type": "object", "properties": {"time": {"type": "string", "format": "time"},
                                                     "label": {"type": "string"}},
                    "required": ["time"]}},
    {"name": "set_lights", "description": "Turn a room's lights on or off and set brightness.",
     "parameters": {"type": "object", "properties": {
         "room": {"type": "string"}, "state": {"type": "string", "enum": ["on", "off"]},
         "brightness": {"type": "integer", "description": "0 to 100"}},
         "required": ["room", "state"]}},
    {"name": "send_message", "description": "Send a text message to a contact — “now”.",
     "parameters": {"type": "object", "properties": {"contact": {"type": "string"},
                                                     "message": {"type": "string"}},
                    "required": ["contact", "message"]}},
)


def render_prompt(query: str, tools: list[dict], system: str = "") -> str:
    """Upstream `finetune.render_example` prompt (needle3 README "Prompt wire format")."""
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    tools_json = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    return (f"{head}<|im_start|>user\n<tools>{tools_json}</tools>\n{query}<|im_end|>\n"
            "<|im_start|>assistant\n")


def _random_chars(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _json_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return rng.randint(-10**6, 10**6)
    if kind == 1:
        return rng.choice([True, False, None, 3.25, -0.5])
    if kind in (2, 3):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 4)))
    if kind == 4:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(WORDS): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _one(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return _random_chars(rng, rng.randint(1, 40))
    if kind == 1:
        value = _json_value(rng)
        if rng.random() < 0.5:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=rng.random() < 0.3)
        return json.dumps(value, ensure_ascii=False, indent=rng.choice([None, 2]))
    if kind == 2:
        tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
        query = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        return render_prompt(query, tools, rng.choice(["", "date: 2026-07-21 Tue 14:30"]))
    if kind == 3:
        answer = json.dumps([{"name": "set_alarm", "arguments": {"time": "06:45"}}],
                            separators=(",", ":"))
        return rng.choice(["", "<think>\nwake up\n</think>\n"]) + f"<tool_call>{answer}</tool_call>"
    pools = (WORDS, WORDS, SPACES, MARKERS, LOOKALIKES)
    parts = []
    for _ in range(rng.randint(1, 12)):
        pool = rng.choice(pools[: 2 + kind % 4])
        parts.append(rng.choice(pool))
        if rng.random() < 0.5:
            parts.append(rng.choice(SPACES[:3]))
    if rng.random() < 0.2:
        parts.insert(0, rng.choice(SPACES))
    if rng.random() < 0.15:
        parts.append(_random_chars(rng, rng.randint(1, 6)))
    return "".join(parts)


def make_corpus(n: int = 2000, seed: int = 20240601) -> list[str]:
    """`n` seeded strings, plus a fixed head of edge cases."""
    rng = random.Random(seed)
    fixed = ["", " ", "  ", "\n", "a", " a", "  a", "a ", "\t\tx", "▁", "▁a", "a▁b", *MARKERS,
             *LOOKALIKES, "".join(MARKERS), " <|im_start|>", "<|im_start|> ", "x<s>y<0x41>z",
             "\x00", "\x7f", "\U0010fffd", "\ufffd\ufffd", "e\u0301\u0301", "<" * 20, " " * 33]
    return fixed + [_one(rng) for _ in range(n)]
