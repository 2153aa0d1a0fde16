"""Server-sent chat-completion chunks built from the generator's deltas as they arrive.

Needle streams a tool call as the raw JSON text of the whole call list
(`[{"name":"f","arguments":{...}},...]`), a few characters per token. OpenAI clients expect
one entry per call instead: a first delta with the call's `index`, `id` and `name`, then
fragments of its `arguments` text. `CallSplitter` is the incremental JSON scanner that turns
the one into the other without waiting for the list to close.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..generation.json_text import string_step
from .schemas import (
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    ChunkFunction,
    ChunkToolCall,
    TokenLogprob,
)
from .stats import answer_stats

if TYPE_CHECKING:  # pragma: no cover
    from .engine import ChatJob, ChatResult, Delta

START, ARGS, END = "start", "args", "end"


class JsonSpacer:
    """Re-spaces JSON text as it streams, as `json.dumps` writes it: no whitespace outside
    strings except one space after each `,` and `:`; strings copied as written. So streamed
    arguments read as the final ones (`json.dumps(arguments)`), whatever separators the
    model or the grammar used."""

    def __init__(self) -> None:
        self.in_string = False
        self.escape = False

    def feed(self, text: str) -> str:
        out = []
        for ch in text:
            if self.in_string:
                out.append(ch)
                self.in_string, self.escape = string_step(ch, self.escape)
            elif ch in " \t\r\n":
                continue
            else:
                out.append(ch + " " if ch in ",:" else ch)
                self.in_string = ch == '"'
        return "".join(out)


class CallSplitter:
    """Incremental scanner of a JSON list of `{"name": ..., "arguments": {...}}` objects.

    `feed(text)` returns `(START, index, name)` once a call's name is complete,
    `(ARGS, index, fragment)` for each piece of its arguments' raw JSON text and
    `(END, index, "")` when the call's object closes. Arguments seen
    before the name (key order is not guaranteed without a grammar) are held back until it.
    Only the nesting level of the call objects is interpreted; everything deeper is copied.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.index = -1
        self.expect = "key"  # at depth 2: "key", "colon", "value", "after"
        self.key = ""
        self.value_kind: str | None = None  # "key", "name", "arguments", "other" while capturing
        self.value: list[str] = []
        self.value_depth = 0  # depth at which the captured value started
        self.name: str | None = None
        self.held: list[str] = []  # argument text waiting for the name

    def feed(self, text: str) -> list[tuple[str, int, str]]:
        out: list[tuple[str, int, str]] = []
        for ch in text:
            self._char(ch, out)
        return out

    def _char(self, ch: str, out: list[tuple[str, int, str]]) -> None:
        if self.in_string:
            self._capture(ch, out)
            self.in_string, self.escape = string_step(ch, self.escape)
            if not self.in_string and self.depth == 2 and self.value_kind is not None:
                self._end_value(out)  # a string key or value at the call level ended
            return
        if ch in " \t\r\n":
            if self.value_kind is not None and self.depth > 2:
                self._capture(ch, out)
            return
        if self.depth == 2 and self.value_kind is None:
            if ch == ":":
                self.expect = "value"
                return
            if ch == ",":
                self.expect = "key"
                return
            if ch not in "}]":
                self._start_value()
        elif self.depth == 2 and self.value_kind is not None and ch in ",}":
            self._end_value(out)  # end of a number / true / false / null value
            if ch == ",":
                self.expect = "key"
                return
        if ch == '"':
            self.in_string = True
            self._capture(ch, out)
        elif ch in "{[":
            if self.depth == 1 and ch == "{":
                self.index += 1
                self.expect, self.name, self.held = "key", None, []
            else:
                self._capture(ch, out)
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if self.depth >= 2:
                self._capture(ch, out)
                if self.depth == 2 and self.value_kind is not None:
                    self._end_value(out)
            elif self.depth == 1 and self.name is None and self.index >= 0:
                self._start_call("", out)  # a call without a name: report it anyway
            if self.depth == 1 and self.index >= 0:
                out.append((END, self.index, ""))
        else:
            self._capture(ch, out)

    def _start_value(self) -> None:
        self.value_kind = (
            "key"
            if self.expect == "key"
            else (self.key if self.key in ("name", "arguments") else "other")
        )
        self.value = []
        self.value_depth = self.depth

    def _capture(self, ch: str, out: list[tuple[str, int, str]]) -> None:
        if self.value_kind is None:
            return
        if self.value_kind == "arguments":
            if self.name is None:
                self.held.append(ch)
            else:
                out.append((ARGS, self.index, ch))
        else:
            self.value.append(ch)

    def _end_value(self, out: list[tuple[str, int, str]]) -> None:
        kind, raw = self.value_kind, "".join(self.value)
        self.value_kind = None
        if kind == "key":
            self.key = _loads_str(raw)
            self.expect = "colon"
            return
        self.expect = "after"
        if kind == "name" and self.name is None:
            self._start_call(_loads_str(raw), out)

    def _start_call(self, name: str, out: list[tuple[str, int, str]]) -> None:
        self.name = name
        out.append((START, self.index, name))
        if self.held:
            out.append((ARGS, self.index, "".join(self.held)))
            self.held = []


def _loads_str(raw: str) -> str:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw.strip('"')
    return value if isinstance(value, str) else str(value)


def merge_args(events: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """Join consecutive argument fragments of one call (one SSE chunk per token, not char)."""
    merged: list[tuple[str, int, str]] = []
    for event in events:
        if merged and event[0] == ARGS and merged[-1][0] == ARGS and merged[-1][1] == event[1]:
            merged[-1] = (ARGS, event[1], merged[-1][2] + event[2])
        else:
            merged.append(event)
    return merged


class ChunkWriter:
    """Turns one job's deltas into `chat.completion.chunk` payloads."""

    def __init__(self, job: ChatJob, *, include_usage: bool) -> None:
        self.job = job
        self.include_usage = include_usage
        self.splitter = CallSplitter()
        self.started: set[int] = set()
        self.with_args: set[int] = set()  # calls whose arguments text was streamed
        self.spacers: dict[int, JsonSpacer] = {}
        # each call's chunks wait for the end of its object (`_call_event`)
        self.seen: dict[int, tuple[str, str]] = {}  # index -> (name, arguments so far)
        self.held: dict[int, list[tuple[str, int, str]]] = {}

    def _chunk(
        self, delta: ChunkDelta, finish_reason: str | None = None, usage: Any = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        scores = None if logprobs is None else ChoiceLogprobs(
            content=[TokenLogprob(**entry) for entry in logprobs])
        chunk = ChatCompletionChunk(
            id=self.job.completion_id,
            created=self.job.created,
            model=self.job.model_name,
            choices=[ChunkChoice(delta=delta, finish_reason=finish_reason, logprobs=scores)],
            usage=usage,
        )
        payload = chunk.model_dump(exclude_none=True)
        payload["choices"][0]["finish_reason"] = finish_reason  # present, null until the end
        return payload

    def start(self) -> dict[str, Any]:
        return self._chunk(ChunkDelta(role="assistant", content=""))

    def feed(self, item: Delta | ChatResult) -> Iterator[dict[str, Any]]:
        from .engine import ChatResult

        if isinstance(item, ChatResult):
            self.result = item
            return
        if item.reasoning:
            yield self._chunk(ChunkDelta(reasoning_content=item.reasoning))
        if item.content or item.logprobs:
            yield self._chunk(ChunkDelta(content=item.content), logprobs=item.logprobs)
        if item.call_text:
            for kind, index, text in merge_args(self.splitter.feed(item.call_text)):
                yield from self._call_event(kind, index, text)

    def _call_event(self, kind: str, index: int, text: str) -> Iterator[dict[str, Any]]:
        """A call's events, held until its JSON object closes: then sent, unless the call
        repeats an earlier one (the repeat that ends the answer). So the stream has exactly
        the final answer's calls: none cut off by the token limit, no repeat."""
        if kind == START:
            self.held[index] = []
            self.seen[index] = (text, "")
        elif kind == ARGS:
            text = self.spacers.setdefault(index, JsonSpacer()).feed(text)
            name, args = self.seen.get(index, ("", ""))
            self.seen[index] = (name, args + text)
        else:  # END: a held call that repeats none of the calls before it is sent now
            if index in self.held and self.seen.get(index) not in [
                    self.seen[i] for i in self.seen if i < index]:
                for event in self.held.pop(index):
                    yield self._call_chunk(*event)
            return
        if index in self.held:
            self.held[index].append((kind, index, text))
        else:
            yield self._call_chunk(kind, index, text)

    def _call_chunk(self, kind: str, index: int, text: str) -> dict[str, Any]:
        if kind == START:
            self.started.add(index)
            call = ChunkToolCall(
                index=index,
                id=self.job.call_id(index),
                type="function",
                function=ChunkFunction(name=text, arguments=""),
            )
        else:
            self.with_args.add(index)
            call = ChunkToolCall(index=index, function=ChunkFunction(arguments=text))
        return self._chunk(ChunkDelta(tool_calls=[call]))

    def finish(self) -> Iterator[dict[str, Any]]:
        result: ChatResult = self.result
        for index in sorted(self.held):  # held calls the answer kept
            if index < len(result.calls):
                for event in self.held[index]:
                    yield self._call_chunk(*event)
        # Calls the scanner could not follow (malformed text without a grammar) are sent
        # whole, so the streamed answer never has fewer calls than the final one.
        for index, (name, arguments) in enumerate(result.calls):
            if index not in self.started:
                yield self._call_chunk(START, index, name)
            if index not in self.with_args:  # e.g. a call written without "arguments"
                yield self._call_chunk(ARGS, index, arguments)
        final = self._chunk(ChunkDelta(), finish_reason=result.finish_reason)
        final["needlepoint"] = answer_stats(result.envelope)  # an extension; clients ignore it
        yield final
        if self.include_usage:
            chunk = ChatCompletionChunk(
                id=self.job.completion_id,
                created=self.job.created,
                model=self.job.model_name,
                choices=[],
                usage=result.usage(),
            )
            yield chunk.model_dump(exclude_none=True)

