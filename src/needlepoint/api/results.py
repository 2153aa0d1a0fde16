"""Turning turns into what `Needle` returns: tool results as JSON data, the envelope of a
finished event stream, and the summary envelope of an agent loop (`Needle.run`)."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import InvalidOptionError
from ..generation.events import DeltaEvent, Done


def jsonable(value: Any) -> Any:
    """A tool's return value as plain JSON data (pydantic models, dataclasses, enums)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, enum.Enum):
        return value.value
    return json.loads(json.dumps(value, default=str))


def final(events: Iterator[Any]) -> dict[str, Any]:
    """The envelope of the `Done` event that ends `events` (consuming them)."""
    envelope = None
    for event in events:
        if isinstance(event, Done):
            envelope = event.envelope
    assert envelope is not None
    return envelope


def annotated(events: Iterator[DeltaEvent | Done], fields: Mapping[str, Any]
              ) -> Iterator[DeltaEvent | Done]:
    """`events` with `fields` added to the final envelope (notes, dropped turns)."""
    for event in events:
        if isinstance(event, Done) and fields:
            event.envelope.update(fields)
        yield event


def check_rounds(rounds: Any) -> int:
    """`max_rounds` of `Needle.run`: an int >= 1, else InvalidOptionError."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidOptionError(f"max_rounds must be an int >= 1, got {rounds!r}")
    return rounds


def call_key(call: Mapping[str, Any]) -> str:
    return json.dumps([call["name"], call["arguments"]], sort_keys=True)


def summary(turns: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    last = turns[-1]
    # the least confident turn's confidence and its source (a handed-off turn has none)
    rated = [t for t in turns if t.get("confidence") is not None]
    lowest = min(rated, key=lambda t: t["confidence"]) if rated else None
    timings: dict[str, float] = {}
    for turn in turns:
        for key, value in turn["timings"].items():
            timings[key] = timings.get(key, 0) + value
    for rate, tokens, seconds in (("prefill_tps", "prefill_tokens", "prefill_s"),
                                  ("decode_tps", "decode_tokens", "decode_s")):
        timings[rate] = timings[tokens] / timings[seconds] if timings[seconds] > 0 else 0.0
    return {
        **last,
        "type": "call" if results else last["type"],
        "function_calls": [{"name": r["name"], "arguments": r["arguments"]} for r in results]
        if results else last["function_calls"],
        "results": results,
        "reasoning": "\n".join(t["reasoning"] for t in turns if t["reasoning"]),
        "confidence": lowest["confidence"] if lowest else None,
        "confidence_source": lowest.get("confidence_source") if lowest else None,
        "timings": timings,
        "turns": turns,
    }

