"""The result envelope of a turn, in the shape users of `cactus-needle` know.

    {"type": "call" | "refuse" | "respond",
     "function_calls": [{"name": ..., "arguments": {...}}, ...],
     "text": str,            # the plain answer of a "respond" turn ("" otherwise)
     "reasoning": str,       # the think block, "" when there is none
     "confidence": float | None,
     "token_confidence": float | None,
     "timings": {...}}

"call" = a non-empty call list, "refuse" = `<tool_call>[]</tool_call>`, "respond" = the turn
ended without a call (or its call text was not a well-formed list of calls, which only happens
with the grammar off: then "error" says why and "text" holds the raw call text). "invalid" =
well-formed calls that break the tool schemas (only with the grammar off, when the tools are
given to check against): "function_calls" holds them as written, "error" says what is wrong,
and nothing should execute them. With `logprobs` requested, "logprobs" lists one entry per
answer-text token.

"confidence" is the confidence head's (with the call tokens' probabilities), None when the
archive has no head. "token_confidence" is there for every model (issue 29 item 3): the
lowest unmasked probability of a token chosen inside the call (`<tool_call>` through its
closing marker; a refusal `[]` included), or, for an answer without a call, the probability
of the turn's first sampled token (the model's respond-or-call decision); None only when no
token was sampled. `answer_confidence` picks the one a hand-off compares with its threshold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..generation.call_check import call_errors
from ..generation.turn_result import TurnResult


def parse_calls(call_text: str) -> list[dict[str, Any]]:
    """The calls of a `<tool_call>` body: a JSON list of `{"name": str, "arguments": object}`.
    Raises ValueError (json.JSONDecodeError included) when it is anything else."""
    value = json.loads(call_text)
    if not isinstance(value, list):
        raise ValueError(f"tool call is a JSON {type(value).__name__}, not a list")
    calls = []
    for k, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"call {k} has no string 'name'")
        arguments = item.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ValueError(f"call {k} arguments are not an object")
        calls.append({"name": item["name"], "arguments": arguments})
    return calls


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def combine_confidence(head_logit: float | None, call_token_probs: Sequence[float]) -> float | None:
    """min(sigmoid(head logit), lowest chosen-token probability in the call); None when the
    archive has no confidence head."""
    if head_logit is None:
        return None
    return min([sigmoid(float(head_logit)), *map(float, call_token_probs)])


def token_confidence(result: TurnResult) -> float | None:
    """The confidence of a turn from its own token probabilities (see the module doc)."""
    if result.call_token_probs:
        return min(map(float, result.call_token_probs))
    return result.first_token_prob


def answer_confidence(envelope: dict[str, Any]) -> float | None:
    """The head's confidence where the archive has one, else the token confidence."""
    head = envelope.get("confidence")
    return head if head is not None else envelope.get("token_confidence")


def timings(result: TurnResult, confidence_s: float = 0.0) -> dict[str, float | int]:
    """Throughput figures of one turn (tokens per second are 0 when nothing was timed)."""
    decode_tokens = result.decode_tokens
    return {
        "prefill_tokens": result.prefill_tokens,
        "decode_tokens": decode_tokens,
        "prefill_s": result.prefill_s,
        "decode_s": result.decode_s,
        "confidence_s": confidence_s,
        "prefill_tps": result.prefill_tokens / result.prefill_s if result.prefill_s > 0 else 0.0,
        "decode_tps": decode_tokens / result.decode_s if result.decode_s > 0 else 0.0,
        "total_s": result.prefill_s + result.decode_s + confidence_s,
    }


def turn_envelope(
    result: TurnResult,
    *,
    confidence: float | None = None,
    confidence_s: float = 0.0,
    check_tools: Sequence[dict[str, Any]] | None = None,
    require_call: bool = False,
    parallel_calls: bool = True,
) -> dict[str, Any]:
    """The envelope of one decoded turn. `check_tools` (the offered tool dicts, for a turn
    decoded without the grammar) validates the calls: any problem makes it "invalid"."""
    envelope: dict[str, Any] = {"type": "respond", "function_calls": [], "text": result.text,
                                "reasoning": result.reasoning}
    if result.call_text is not None:
        try:
            if not result.call_closed:
                raise ValueError(f"tool call not closed (stopped: {result.stop_reason})")
            calls = parse_calls(result.call_text)
        except ValueError as error:
            envelope["text"] = result.call_text
            envelope["error"] = f"malformed tool call: {error}"
        else:
            envelope["type"] = "call" if calls else "refuse"
            envelope["function_calls"] = calls
            problems = [] if check_tools is None else call_errors(
                calls, check_tools, require_call=require_call, parallel_calls=parallel_calls)
            if problems:
                envelope["type"] = "invalid"
                envelope["error"] = "invalid tool call: " + "; ".join(problems)
    envelope["confidence"] = confidence
    envelope["token_confidence"] = token_confidence(result)
    envelope["timings"] = timings(result, confidence_s)
    envelope["stop_reason"] = result.stop_reason
    if result.logprobs is not None:
        envelope["logprobs"] = result.logprobs
    return envelope
