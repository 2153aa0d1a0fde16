"""The Needle chat wire format: prompt text and token ids.

Single turn (fixture README "Prompt wire format", upstream `finetune.render_example`):

    [<|im_start|>system\\n{facts}<|im_end|>\\n]          only if there are system facts
    <|im_start|>user\\n<tools>{tools_json}</tools>\\n{query}<|im_end|>\\n<|im_start|>assistant\\n

ids = [BOS] + encode(prompt). Markers are split out by the tokenizer as single ids.

Later turns continue the same token sequence (the KV cache is reused, not recomputed). They
are *our* convention, since upstream documents no multi-turn format: after the assistant's
`<|im_end|>` comes `\\n<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n`, where a
tool result turn's content is `<tool_result>{results_json}</tool_result>` with results_json the
compact JSON list `[{"name": ..., "result": ...}, ...]` in call order.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESULT_OPEN, TOOL_RESULT_CLOSE = "<tool_result>", "</tool_result>"


def compact_json(value: Any) -> str:
    """JSON as the wire format writes it: no spaces, non-ASCII kept as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def date_fact(now: _dt.datetime | None = None) -> str:
    """Upstream's automatic system fact: `YYYY-MM-DD Ddd HH:MM` in local time."""
    now = now or _dt.datetime.now()
    return now.strftime("%Y-%m-%d %a %H:%M")


def render_system(system: str | Mapping[str, Any] | None) -> str:
    """System facts as `key: value; key: value` (a string is taken verbatim)."""
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    return "; ".join(f"{key}: {value}" for key, value in system.items())


def with_date(system: str | Mapping[str, Any] | None, now: _dt.datetime | None = None) -> str:
    """`system` plus a `date:` fact unless one is already given (upstream `auto_date`)."""
    text = render_system(system)
    if "date:" in text:
        return text
    fact = f"date: {date_fact(now)}"
    return f"{text}; {fact}" if text else fact


def render_prompt(tools: Sequence[Mapping[str, Any]], query: str, system: str = "") -> str:
    """The first turn's prompt text (without BOS)."""
    head = f"{IM_START}system\n{system}{IM_END}\n" if system else ""
    return (
        f"{head}{IM_START}user\n<tools>{compact_json(list(tools))}</tools>\n{query}{IM_END}\n"
        f"{IM_START}assistant\n"
    )


def render_user_turn(content: str) -> str:
    """A later user turn, continuing right after the previous assistant `<|im_end|>`."""
    return f"\n{IM_START}user\n{content}{IM_END}\n{IM_START}assistant\n"


def render_tool_results(results: Sequence[Mapping[str, Any]]) -> str:
    """The user-turn content that carries tool results back to the model."""
    return f"{TOOL_RESULT_OPEN}{compact_json(list(results))}{TOOL_RESULT_CLOSE}"


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a first-turn prompt: `[BOS] + encode(text)`."""
    return [tokenizer.bos_id, *tokenizer.encode(text)]


def continuation_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids of text appended mid-sequence: the encoding without the dummy-prefix space.

    SentencePiece prepends one U+2581 to every encoded text. Mid-sequence that space does not
    exist, so it is removed again; continuation texts start with a newline or a marker, which
    no piece merges with, so the prefix is always a lone U+2581 piece."""
    ids = tokenizer.encode(text)
    if tokenizer.add_dummy_prefix and ids and tokenizer.token_bytes(ids[0]) == b" ":
        ids = ids[1:]
    return ids


def turn_prefix_ids(tokenizer: Any, marker: str) -> list[int]:
    """The ids that begin an assistant answer starting with `marker` (e.g. `<tool_call>`).

    Training encodes the answer separately from the prompt, so with the dummy prefix an
    answer starts with a lone U+2581 piece before the marker: forcing a tool call feeds
    exactly these ids, as the model saw them in training."""
    return tokenizer.encode(marker)
