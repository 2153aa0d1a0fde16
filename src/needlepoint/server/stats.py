"""The `"needlepoint"` extension object of a chat completion (streamed: on the finishing
chunk; not streamed: beside `choices`): the answer's confidence, one per call, the hand-off
mark and the speeds. OpenAI clients ignore it (`model_extra["needlepoint"]` in the Python
client)."""

from __future__ import annotations

from typing import Any

STAT_TIMINGS = ("prefill_tokens", "decode_tokens", "prefill_s", "decode_s", "prefill_tps",
                "decode_tps")


def answer_stats(envelope: dict[str, Any]) -> dict[str, Any]:
    """The extension object on a stream's finishing chunk (`"needlepoint"`): the answer's
    confidence with its source ("head" or "tokens", api/envelope.py; None for an answer
    from the hand-off model), one confidence per call (in the order of `tool_calls`), the
    hand-off mark, the tools left out (`dropped_tools`) and its prefill and decode speeds."""
    timings = envelope.get("timings", {})
    return {"confidence": envelope.get("confidence"),
            "confidence_source": envelope.get("confidence_source"),
            "call_confidences": envelope.get("call_confidences", []),
            "handoff": envelope.get("handoff"),  # None unless handed off
            # tools left out because the grammar cannot hold their schema: {"name", "reason"}
            "dropped_tools": envelope.get("dropped_tools", []),
            "timings": {key: timings[key] for key in STAT_TIMINGS if key in timings}}


__all__ = ["STAT_TIMINGS", "answer_stats"]
