"""The served model and the jobs that run requests on it.

One `Engine` per app: the model is loaded once and its weights are shared read-only by every
request. Each job builds its own `Needle` (its own session and KV cache) on a worker thread,
so concurrent requests share nothing mutable. Jobs are prepared on the event loop (message
mapping, cheap checks) and run on a worker (everything that touches the model).

With a `Scheduler` (continuous batching, `api/scheduler.py`, the default), a running job
holds a lease and its `Needle` decodes on the lease's model view: the job's thread samples
and parses, the scheduler's engine thread runs the model for every job at once. No free
session (the app's one `api.admission.Admission`) is a 429; `cancel()` (the client went
away) frees the job's session at the next engine step.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api.call_salvage import may_be_json_call
from ..api.context import check_fits
from ..api.results import final
from ..errors import ContextLengthError
from ..generation.events import Done, LogprobDelta, ReasoningDelta, TextDelta, ToolCallDelta
from .client_chat import ClientChat, checked_query, from_messages
from .errors import bad_request, context_exceeded, model_not_found
from .fields import REASONING_BUDGETS, check_fields
from .schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    FunctionCallOut,
    ModelCard,
    NativeCompleteRequest,
    SamplingOptions,
    TokenLogprob,
    ToolCallOut,
    Usage,
)
from .stats import answer_stats


@dataclass
class Delta:
    """A piece of the answer as it is decoded (one text field set per event; `logprobs`
    are those of the content tokens that made `content`, when requested)."""

    reasoning: str = ""
    content: str = ""
    call_text: str = ""  # raw JSON text of the call list, as generated
    logprobs: list[dict[str, Any]] | None = None


@dataclass
class ChatResult:
    content: str | None
    reasoning: str
    calls: list[tuple[str, str]]  # (name, arguments as JSON text)
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    envelope: dict[str, Any]
    logprobs: list[dict[str, Any]] | None = None

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
        )


class Engine:
    def __init__(
        self,
        model: Any,
        *,
        model_name: str | None = None,
        needle_factory: Callable[..., Any] | None = None,
        speculate: bool = True,
    ) -> None:
        self.speculate = speculate  # False: `Needle(speculate=False)` (no drafts)
        self.scheduler: Any = None  # set by create_app when batching is on
        self.review: Any = None  # set by create_app with a hand-off (server/handoff.py)
        path = Path(model) if isinstance(model, str | os.PathLike) else None
        if path is not None:
            from ..models.loader import load

            model = load(path)
        if needle_factory is None:
            from ..api.needle import Needle

            needle_factory = Needle
        self.model = model
        self.factory = needle_factory
        # models/protocol.py: the name clients see, and the context length
        self.name = model_name or (path.stem if path is not None else model.capabilities.name)
        self.context_length = int(model.config.max_seq_len)
        self.created = int(time.time())

    def needle(self, tools: list[dict[str, Any]], system: str, model: Any = None,
               template_kwargs: dict[str, Any] | None = None) -> Any:
        """A fresh `Needle` (own session) over the shared model (or `model`, a lease's view
        of it); bad tools raise here."""
        options: dict[str, Any] = {} if self.speculate else {"speculate": False}
        if template_kwargs:  # a request's chat_template_kwargs
            options["template_kwargs"] = template_kwargs
        return self.factory(tools=tools, model=model or self.model, system=system or None,
                            **options)

    @contextmanager
    def leased(self, job: Any) -> Iterator[Any]:
        """The model a job decodes on: the scheduler's view under a lease of the job's own
        (`AdmissionFull`, a 429, past the sessions or the KV budget of the app's one
        `api.admission.Admission`), or the model itself without batching."""
        if self.scheduler is None:
            yield self.model
            return
        lease = self.scheduler.lease()
        job.lease = lease
        if job.cancelled:
            lease.cancel()
        try:
            yield lease.model
        finally:
            lease.close()

    def check_context(self, prompt_tokens: int, max_new_tokens: int | None,
                      first_turn: bool = True) -> None:
        """Refuse prompts the context cannot hold (with room for at least one new token),
        and explicit `max_tokens` that do not fit after the prompt, instead of truncating:
        the library's one context rule (`api.context.check_fits`) as the OpenAI error."""
        try:
            check_fits(prompt_tokens, self.context_length, first_turn, max_new_tokens)
        except ContextLengthError as error:
            raise context_exceeded(error.limit, error.prompt_tokens,
                                   error.max_new_tokens) from None

    def check_model(self, name: str) -> None:
        if name != self.name:
            raise model_not_found(name, self.name)

    def card(self) -> ModelCard:
        return ModelCard(id=self.name, created=self.created, context_length=self.context_length)

    def _max_new_tokens(self, requested: int | None, param: str) -> int | None:
        ctx = self.context_length
        if requested is not None and ctx is not None and requested >= ctx:
            raise bad_request(
                f"{param} is {requested}, but the model's whole context is {ctx} tokens",
                param=param,
                code="invalid_max_tokens",
            )
        return requested

    def chat_job(self, req: ChatCompletionRequest) -> ChatJob:
        check_fields(req)
        asked = from_messages(req.messages, req.tools, req.tool_choice)
        limit = self._max_new_tokens(req.token_limit, "max_tokens")
        return ChatJob(self, asked, {**_options(req, limit), **_chat_options(req)}, limit)

    def native_job(self, req: NativeCompleteRequest) -> NativeJob:
        checked_query(req.text, "text")
        limit = self._max_new_tokens(req.max_new_tokens, "max_new_tokens")
        return NativeJob(self, req.system or "", req.tools, req.text, _options(req, limit),
                         limit)


class Cancellable:
    """A job whose client may go away: `cancel()` ends its lease (if any) at the next step."""

    lease: Any = None
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.lease is not None:
            self.lease.cancel()


class NativeJob(Cancellable):
    """One `/v1/needlepoint/complete` request: the envelope `Needle.complete` would give,
    decoded from the prompt ids it was checked with (`Needle.stream_ids`)."""

    def __init__(self, engine: Engine, system: str, tools: list[dict[str, Any]], text: str,
                 options: dict[str, Any], limit: int | None) -> None:
        self.engine, self.system, self.tools, self.text = engine, system, tools, text
        self.options, self.limit = options, limit

    def run(self) -> dict[str, Any]:
        with self.engine.leased(self) as model:
            needle = self.engine.needle(self.tools, self.system, model)
            ids = needle.prompt_ids(self.text)  # tokenized once: checked, then decoded
            self.engine.check_context(len(ids), self.limit)
            return final(needle.stream_ids(ids, self.text, **self.options))


def _options(req: SamplingOptions, max_new_tokens: int | None) -> dict[str, Any]:
    """Generation options for `Needle.complete/stream`; unset ones keep Needle's defaults."""
    options: dict[str, Any] = {}
    if req.temperature is not None:
        options["temperature"] = req.temperature
    if req.top_p is not None:
        options["top_p"] = req.top_p
    if req.top_k is not None:
        options["top_k"] = req.top_k
    if req.seed is not None:
        options["seed"] = req.seed  # int64, the library's own seed rule
    if max_new_tokens is not None:
        options["max_new_tokens"] = max_new_tokens
    if req.call_threshold is not None:
        options["call_threshold"] = req.call_threshold
    return options


def _chat_options(req: ChatCompletionRequest) -> dict[str, Any]:
    """The chat-only fields as `Needle` options (see `fields.py` for the whole policy)."""
    options: dict[str, Any] = {}
    if req.parallel_tool_calls is False:
        options["parallel_tool_calls"] = False
    if req.stop:
        options["stop"] = req.stop
    if req.logprobs:
        options["logprobs"] = req.top_logprobs or 0
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        options["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        options["response_format"] = fmt.json_schema.schema_
    if req.reasoning_effort is not None:
        options["reasoning_budget"] = REASONING_BUDGETS[req.reasoning_effort]
    if req.chat_template_kwargs:
        options["template_kwargs"] = dict(req.chat_template_kwargs)
    return options


class ChatJob(Cancellable):
    """One chat-completion request: prepared on the event loop, run on a worker."""

    def __init__(
        self,
        engine: Engine,
        asked: ClientChat,
        options: dict[str, Any],
        max_new_tokens: int | None,
    ) -> None:
        self.engine = engine
        self.asked = asked  # the chat to answer, its tools and forcing
        self.options = options
        self.max_new_tokens = max_new_tokens
        token = secrets.token_hex(12)
        self.completion_id = f"chatcmpl-{token}"
        self._call_prefix = f"call_{token[:16]}"
        self.created = int(time.time())
        self.model_name = engine.name

    def call_id(self, index: int) -> str:
        return f"{self._call_prefix}_{index}"

    # -- running (worker thread) ----------------------------------------------------------
    def stream(self) -> Iterator[Delta | ChatResult]:
        items = self._leased_stream()
        yield from items if self.engine.review is None else self.engine.review(self, items)

    def _leased_stream(self) -> Iterator[Delta | ChatResult]:
        with self.engine.leased(self) as model:
            yield from self._stream(model)

    def _stream(self, model: Any) -> Iterator[Delta | ChatResult]:
        asked, chat = self.asked, self.asked.chat
        options = dict(self.options)
        needle = self.engine.needle(asked.tools, chat.system, model,
                                    options.pop("template_kwargs", None))
        if asked.force is not None:
            options["require_call"] = True
        if not asked.tools:  # tool_choice "none", or no tools: the answer is text
            options["allow_call"] = False
        # the prompt is tokenized once: its length is checked against the context and
        # reported as usage, and the same ids are decoded (`Needle.stream_ids`)
        ids = needle.chat_ids(chat)
        self.engine.check_context(len(ids), self.max_new_tokens, chat.first_turn)
        events = needle.stream_ids(ids, chat.query, **options)
        envelope: dict[str, Any] | None = None
        held: Delta | None = None  # a content delta, waiting for its token's logprob
        json_held: list[str] | None = None  # JSON text that may be a call (call_salvage.py)
        texts = 0
        for event in events:
            if isinstance(event, LogprobDelta):
                if held is not None:
                    held.logprobs = [event.entry]
                    yield held
                    held = None
                else:
                    yield Delta(logprobs=[event.entry])
                continue
            if held is not None:
                yield held
                held = None
            if isinstance(event, ReasoningDelta):
                yield Delta(reasoning=event.text)
            elif isinstance(event, TextDelta):
                if json_held is None and not texts and asked.tools and \
                        "logprobs" not in options:
                    json_held = []  # maybe a JSON call outside the template's syntax
                texts += 1
                if json_held is not None:
                    json_held.append(event.text)
                    if may_be_json_call("".join(json_held)):
                        continue
                    yield Delta(content="".join(json_held))  # plain text after all
                    json_held = None
                elif "logprobs" in options:
                    held = Delta(content=event.text)
                else:
                    yield Delta(content=event.text)
            elif isinstance(event, ToolCallDelta):
                yield Delta(call_text=event.text)
            elif isinstance(event, Done):
                envelope = event.envelope
        if held is not None:
            yield held
        if envelope is None:
            raise RuntimeError("the generator ended without a final envelope")
        if json_held and not envelope.get("function_calls"):
            yield Delta(content="".join(json_held))
        yield self._result(envelope, prompt_tokens=len(ids))

    def run(self) -> ChatResult:
        for item in self.stream():
            if isinstance(item, ChatResult):
                return item
        raise RuntimeError("the generator ended without a result")  # pragma: no cover

    def _result(self, envelope: dict[str, Any], *, prompt_tokens: int) -> ChatResult:
        calls = [
            (
                call["name"],
                json.dumps(call.get("arguments", {}), ensure_ascii=False),  # as streamed
            )
            for call in envelope.get("function_calls", [])
        ]
        timings = envelope.get("timings", {})
        stop = envelope.get("stop_reason")
        if stop == "length":
            finish = "length"
        elif calls:
            finish = "tool_calls"
        else:
            finish = "stop"
        return ChatResult(
            # A "refuse" (`[]`) or plain answer is text, possibly empty; calls carry none.
            content=None if calls else envelope.get("text", ""),
            reasoning=envelope.get("reasoning", ""),
            calls=calls,
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=int(timings.get("decode_tokens", 0)),
            envelope=envelope,
            logprobs=envelope.get("logprobs"),
        )

    # -- formatting (event loop) ----------------------------------------------------------
    def completion(self, result: ChatResult) -> ChatCompletion:
        tool_calls = [
            ToolCallOut(id=self.call_id(i), function=FunctionCallOut(name=name, arguments=args))
            for i, (name, args) in enumerate(result.calls)
        ] or None
        message = AssistantMessage(
            content=result.content,
            tool_calls=tool_calls,
            reasoning_content=result.reasoning or None,
        )
        logprobs = None
        if result.logprobs is not None:
            logprobs = ChoiceLogprobs(content=[TokenLogprob(**e) for e in result.logprobs])
        return ChatCompletion(
            needlepoint=answer_stats(result.envelope),
            id=self.completion_id,
            created=self.created,
            model=self.model_name,
            choices=[Choice(message=message, finish_reason=result.finish_reason,
                            logprobs=logprobs)],
            usage=result.usage(),
        )
