"""The result envelope of a turn, in the shape users of `cactus-needle` know.

    {"type": "call" | "refuse" | "respond",
     "function_calls": [{"name": ..., "arguments": {...}}, ...],
     "text": str,            # the plain answer of a "respond" turn ("" otherwise)
     "reasoning": str,       # the think block, "" when there is none
     "confidence": float | None,
     "confidence_source": "head" | "tokens" | None,
     "timings": {...}}

"call" = a non-empty call list, "refuse" = `<tool_call>[]</tool_call>`, "respond" = the turn
ended without a call (or its call text was not a well-formed list of calls, which only happens
with the grammar off: then "error" says why and "text" holds the raw call text). "invalid" =
well-formed calls that break the tool schemas (only with the grammar off, when the tools are
given to check against): "function_calls" holds them as written, "error" says what is wrong,
and nothing should execute them. With `logprobs` requested, "logprobs" lists one entry per
answer-text token.

"confidence" is the answer's confidence for every model (issue 29 item 3), in [0, 1], and
"confidence_source" says which measure it is:
* "head": the archive has a confidence head: min(sigmoid(head logit), lowest chosen-token
  probability in the call) (`combine_confidence`);
* "tokens": no head (the bundled demo model, SmolLM2, Hugging Face models): the lowest
  unmasked probability of a token chosen inside the call (after `<tool_call>` through its
  closing marker; a refusal `[]` included), or, for an answer without a call, the
  probability of the turn's first sampled token (the model's respond-or-call decision)
  (`token_confidence`).
The token measure is float64 arithmetic on the turn's own logits (softmax at temperature 1,
before any mask), so it has the same bits at any batch, chunk or thread count, as the logits
do. Both are None only when the model chose no token at all (a turn cut at `max_new_tokens`
by forced tokens alone: stop_reason "length").
A hand-off's remote answer has None too (`handoff["confidence"]` keeps the local one).
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
    """min(sigmoid(head logit), lowest chosen-token probability in the call); without a head
    logit the lowest chosen-token probability alone (None when there is none)."""
    measures = [*map(float, call_token_probs)]
    if head_logit is not None:
        measures.append(sigmoid(float(head_logit)))
    return min(measures) if measures else None


def token_confidence(result: TurnResult) -> float | None:
    """The confidence of a turn from its own token probabilities (see the module doc)."""
    by_call = combine_confidence(None, result.call_token_probs)
    return by_call if by_call is not None else result.first_token_prob


def turn_confidence(result: TurnResult, head_logit: float | None
                    ) -> tuple[float | None, str | None]:
    """(confidence, source) of a turn: the head's where there is a head logit, else the
    token measure (see the module doc)."""
    if head_logit is not None:
        return combine_confidence(head_logit, result.call_token_probs), "head"
    measure = token_confidence(result)
    return measure, (None if measure is None else "tokens")


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
    head_logit: float | None = None,
    confidence_s: float = 0.0,
    check_tools: Sequence[dict[str, Any]] | None = None,
    require_call: bool = False,
    parallel_calls: bool = True,
) -> dict[str, Any]:
    """The envelope of one decoded turn. `check_tools` (the offered tool dicts, for a turn
    decoded without the grammar) validates the calls: any problem makes it "invalid".
    `head_logit` is the confidence head's (None without a head: the token measure)."""
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
    envelope["confidence"], envelope["confidence_source"] = turn_confidence(result, head_logit)
    envelope["timings"] = timings(result, confidence_s)
    envelope["stop_reason"] = result.stop_reason
    if result.logprobs is not None:
        envelope["logprobs"] = result.logprobs
    return envelope
