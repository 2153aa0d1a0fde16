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
with the grammar off: then "error" says why and "text" holds the raw call text). A call list
cut by the token limit (stop_reason "length") or ended by a repeated call ("repeat") keeps
every call finished before the cut (`call_salvage.py`): it is a "call", never text. With
`text_call_tools` (the tools of an auto turn), a text answer that is only a JSON call of those
tools (bare or in a fenced ```json block) is a "call" too, marked `"call_syntax": "text"`
(`call_salvage.text_calls`); its confidence is its route's (the text tokens are not judged).
"invalid" =
well-formed calls that break the tool schemas (only with the grammar off, when the tools are
given to check against): "function_calls" holds them as written, "error" says what is wrong,
and nothing should execute them. With `logprobs` requested, "logprobs" lists one entry per
answer-text token.

"confidence" is the answer's confidence for every model, in [0, 1], an estimate of the chance
that it is right, and "confidence_source" says which measure it is:
* "head": the archive has a confidence head: min(sigmoid(head logit), lowest chosen-token
  probability in the call) (`combine_confidence`);
* "tokens": no head (template models: Qwen, Gemma, SmolLM2, ...; the demo archive): built
  from the decisions the model made in the answer, grammar-forced tokens left out
  (`confidence.py`, `generation/decisions.py`): the product over its decisions (call or
  answer, which function, each argument value where the grammar left a choice) of the
  chosen alternative's probability among the grammar-allowed tokens, through the calibration
  hook `confidence.CALIBRATION`.
"call_confidences" gives one such number per call (the product over that call's own
decisions), in the order of "function_calls"; "decisions" lists the evidence:
`{"kind": "route" | "call" | "between", "call": k | None, "prob": float, "tokens": int}`.
The measure is float64 arithmetic on the turn's own logits (softmax at temperature 1, before
any mask), so it has the same bits at any batch, chunk or thread count, as the logits do.
"confidence" is None when the model decided nothing (a text-only turn: no tools, or
`tool_choice="none"`; a turn cut by forced tokens alone).
A hand-off's remote answer has None too (`handoff["confidence"]` keeps the local one).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..generation.call_check import call_errors
from ..generation.turn_result import TurnResult
from .call_salvage import complete_calls, text_calls
from .confidence import answer_evidence, call_evidence, published


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


def token_confidence(result: TurnResult, calls: int = 0) -> float | None:
    """The published confidence of a turn with `calls` calls from its decisions (see the
    module doc and `confidence.py`)."""
    return published(answer_evidence(result.decisions, calls))


def call_confidences(result: TurnResult, calls: int) -> list[float | None]:
    """The published confidence of each of the turn's `calls` calls."""
    return [published(raw) for raw in call_evidence(result.decisions, calls)]


def turn_confidence(result: TurnResult, head_logit: float | None, calls: int = 0
                    ) -> tuple[float | None, str | None]:
    """(confidence, source) of a turn: the head's where there is a head logit, else the
    decisions' measure (see the module doc)."""
    if head_logit is not None:
        return combine_confidence(head_logit, result.call_token_probs), "head"
    measure = token_confidence(result, calls)
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
    text_call_tools: Sequence[dict[str, Any]] | None = None,
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
            calls = complete_calls(result.call_text)  # what was finished before the cut
            if not calls:
                envelope["text"] = result.call_text
                envelope["error"] = f"malformed tool call: {error}"
        if calls is not None and (calls or "error" not in envelope):
            envelope["type"] = "call" if calls else "refuse"
            envelope["function_calls"] = calls
            problems = [] if check_tools is None else call_errors(
                calls, check_tools, require_call=require_call, parallel_calls=parallel_calls)
            if problems:
                envelope["type"] = "invalid"
                envelope["error"] = "invalid tool call: " + "; ".join(problems)
    if result.call_text is None and text_call_tools:
        calls = text_calls(result.text, text_call_tools)
        if calls and (parallel_calls or len(calls) == 1):
            envelope.update(type="call", function_calls=calls, text="", call_syntax="text")
    count = len(envelope["function_calls"])
    envelope["confidence"], envelope["confidence_source"] = turn_confidence(result, head_logit,
                                                                            count)
    envelope["call_confidences"] = call_confidences(result, count)
    if envelope.get("call_syntax") == "text":  # no call token was judged: the route's
        envelope["call_confidences"] = [envelope["confidence"]] * count
    envelope["decisions"] = [d.as_dict() for d in result.decisions]
    envelope["timings"] = timings(result, confidence_s)
    envelope["stop_reason"] = result.stop_reason
    if result.logprobs is not None:
        envelope["logprobs"] = result.logprobs
    return envelope
