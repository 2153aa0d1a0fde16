"""Confidence hand-off on the server: `serve --handoff-url URL
--handoff-model M --handoff-below 0.7`.

Every chat job (chat completions and the Responses API alike) is reviewed when its answer is
complete: a local answer that `api/handoff.Handoff.reason` flags (below the threshold, cut, or
no valid call) is sent to the endpoint with the chat the local model answered
(`api.chat.Chat.openai_messages`, as `Needle`'s hand-off sends it) and the tools it was
offered, and the
endpoint's answer is what the client gets, its envelope marked `handoff: {"reason",
"confidence", "model", "answered"}`; a failing endpoint leaves the local answer, marked with
the reason and the error (never a 500). The answer is held back until it is reviewed, so a
stream with hand-off on starts at the end of the local answer. Each hand-off is counted in
`needlepoint_handoffs_total{reason, outcome}`; responses carry `X-Needlepoint-Handoff`.
The key (`--handoff-key-env NAME`) is read from the environment, never logged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter

from ..api.handoff import Handoff
from .engine import ChatResult, Delta

log = logging.getLogger("needlepoint.server")


class HandoffReview:
    """Wraps a chat job's items: the local answer, or the hand-off endpoint's."""

    def __init__(self, handoff: Handoff, registry: Any) -> None:
        self.handoff = handoff
        self.counter = Counter("needlepoint_handoffs", "Answers handed off to the bigger "
                               "model, by reason and outcome (answered: its answer was "
                               "returned; failed: the local one was)", ["reason", "outcome"],
                               registry=registry)

    def __call__(self, job: Any, items: Iterator[Delta | ChatResult]
                 ) -> Iterator[Delta | ChatResult]:
        held = list(items)  # the whole local answer (its lease is free once it is done)
        result = held[-1]
        assert isinstance(result, ChatResult)
        if self.handoff.reason(result.envelope) is None:
            yield from held
            return
        asked = job.asked
        reviewed = self.handoff.review(result.envelope, asked.chat.openai_messages(),
                                       asked.tools, {})
        mark = reviewed["handoff"]
        self.counter.labels(mark["reason"], "answered" if mark["answered"] else "failed").inc()
        if not mark["answered"]:
            log.warning("hand-off to %s failed (%s); the local answer is returned",
                        mark["model"], mark.get("error"))
            yield from held[:-1]
            yield dataclasses.replace(result, envelope=reviewed)
            return
        yield from _remote_items(result, reviewed)


def _remote_items(local: ChatResult, envelope: dict[str, Any]
                  ) -> Iterator[Delta | ChatResult]:
    """The endpoint's answer as the items of a chat job."""
    calls = [(c["name"], json.dumps(c["arguments"], ensure_ascii=False, separators=(",", ":")))
             for c in envelope["function_calls"]]
    if envelope.get("reasoning"):
        yield Delta(reasoning=envelope["reasoning"])
    if calls:
        yield Delta(call_text=json.dumps([{"name": c["name"], "arguments": c["arguments"]}
                                          for c in envelope["function_calls"]]))
    elif envelope["text"]:
        yield Delta(content=envelope["text"])
    usage = envelope.get("usage", {})
    finish = "length" if envelope.get("stop_reason") == "length" else \
        "tool_calls" if calls else "stop"
    yield ChatResult(content=None if calls else envelope["text"],
                     reasoning=envelope.get("reasoning", ""), calls=calls,
                     finish_reason=finish, prompt_tokens=local.prompt_tokens,
                     completion_tokens=int(usage.get("completion_tokens", 0)),
                     envelope=envelope)


def handoff_headers(envelope: dict[str, Any] | None) -> dict[str, str]:
    """`X-Needlepoint-Handoff: REASON; model=M; answered=true|false` for a handed-off answer."""
    mark = (envelope or {}).get("handoff")
    if not mark:
        return {}
    answered = "true" if mark.get("answered") else "false"
    return {"X-Needlepoint-Handoff": f"{mark['reason']}; model={mark['model']}; "
                                     f"answered={answered}"}
