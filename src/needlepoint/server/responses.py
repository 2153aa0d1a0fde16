"""`POST /v1/responses`: OpenAI's Responses API beside chat completions.

A request is translated to chat messages (`responses_input.py`) and each model answer is a
chat-completion job (`engine.py`) on the same worker pool, scheduler and metrics; its deltas
become the documented stream events: `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta` /
`.done`, `response.function_call_arguments.delta` (as the call's JSON decodes) / `.done`,
`response.output_item.done`, `response.completed`. Without `stream` the same events are
consumed and the completed response is the body. Finished responses are kept in a bounded
in-memory store for `previous_response_id` (`responses_items.ResponseStore`).

MCP tools (`{"type": "mcp", "server_label"}`, `responses_mcp.py`) are function tools to the
model; the calls it makes to them run on the server: with `require_approval: "never"` they
run at once and appear as `mcp_call` items, their results go back to the model and it
answers again (up to `MAX_MCP_ROUNDS`); otherwise an `mcp_approval_request` item ends the
response and the next request's `mcp_approval_response` item runs (or declines) the call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from .engine import ChatResult, Delta
from .errors import bad_request
from .fields import validation_message
from .handoff import handoff_headers
from .responses_input import chat_fields, check_refused, check_tool_types, function_tools
from .responses_input import input_messages as request_messages
from .responses_items import (
    EventCounter,
    ResponseStore,
    function_call_item,
    message_item,
    new_id,
    output_text,
    response_object,
    usage_object,
)
from .responses_mcp import McpBridge, McpPlan
from .responses_schemas import ResponsesRequest
from .schemas import ChatCompletionRequest
from .streaming import ARGS, START, CallSplitter, JsonSpacer, merge_args

MAX_MCP_ROUNDS = 4


class ResponseRun:
    """One `/v1/responses` request: prepared on the event loop, its events produced by
    `events()` (each model answer a chat job on the pool)."""

    def __init__(self, app: FastAPI, req: ResponsesRequest, plan: McpPlan) -> None:
        state = app.state
        self.engine, self.pool, self.metrics = state.engine, state.pool, state.metrics
        self.store: ResponseStore = state.responses
        self.req = req
        self.plan = plan
        self.id = new_id("resp")
        history: list[dict[str, Any]] = []
        previous = None
        if req.previous_response_id is not None:
            previous = self.store.get(req.previous_response_id)
            if previous is None:
                raise bad_request(f"Previous response with id '{req.previous_response_id}' "
                                  "not found.", param="previous_response_id",
                                  code="previous_response_not_found")
            history = list(previous["messages"])
        self.approvals = self.plan.approvals(req.input, previous)
        self.messages = history + request_messages(req)  # the conversation, no instructions
        self.tools = function_tools(req.tools) + self.plan.chat_tools
        self.fields = chat_fields(req)
        self.output: list[dict[str, Any]] = []
        self.usage = [0, 0]
        self.handoff: dict[str, Any] | None = None
        self.chat_request()  # the first job's request is checked now: a 400, not an event

    def chat_request(self) -> ChatCompletionRequest:
        system = [{"role": "system", "content": self.req.instructions}] \
            if self.req.instructions else []
        body = {**self.fields, "messages": system + self.messages}
        if self.tools:
            body["tools"] = self.tools
        else:
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        if not body["messages"]:
            raise bad_request("Invalid 'input': the request has no input to answer.",
                              param="input", code="empty_query")
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as error:
            message, param = validation_message(error.errors()[0])
            raise bad_request(message, param=param) from None

    def response(self, status: str, incomplete: str | None = None) -> dict[str, Any]:
        usage = usage_object(*self.usage) if status != "in_progress" else None
        extra = {"needlepoint": {"handoff": self.handoff}} if self.handoff else None
        return response_object(self.id, self.req, self.engine.name, status=status,
                               output=self.output if status != "in_progress" else [],
                               usage=usage, incomplete=incomplete, extra=extra)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        event = EventCounter()
        started = False
        incomplete = None
        if self.approvals:  # approved calls run first: the model answers their results
            started = True
            yield event("response.created", response=self.response("in_progress"))
            yield event("response.in_progress", response=self.response("in_progress"))
            for approved in self.approvals:
                async for out in self.run_mcp(event, approved):
                    yield out
        for round_number in range(MAX_MCP_ROUNDS + 1):
            job = self.engine.chat_job(self.chat_request())
            pump = self.pool.stream(self.pool.admit(), self.metrics.chat_stream(job),
                                    job.cancel)
            try:
                more, item = await pump.next()  # errors before any output: a proper 4xx
                if not started:
                    started = True
                    yield event("response.created", response=self.response("in_progress"))
                    yield event("response.in_progress", response=self.response("in_progress"))
                index, item_id, text, result = len(self.output), None, [], None
                splitter, live = CallSplitter(), {}  # call k -> [item id, args streamed]
                spacers: dict[int, JsonSpacer] = {}  # arguments spaced as the final ones
                while more:
                    if isinstance(item, Delta) and item.call_text:
                        for kind, k, piece in merge_args(splitter.feed(item.call_text)):
                            if kind == START and not self.plan.owns(piece):
                                live[k] = [new_id("fc"), False]  # MCP calls: at the end
                                yield event("response.output_item.added",
                                            output_index=index + (item_id is not None) + k,
                                            item=function_call_item(live[k][0], job.call_id(k),
                                                                    piece, "", "in_progress"))
                            elif kind == ARGS and k in live:
                                live[k][1] = True
                                piece = spacers.setdefault(k, JsonSpacer()).feed(piece)
                                yield event("response.function_call_arguments.delta",
                                            item_id=live[k][0], delta=piece,
                                            output_index=index + (item_id is not None) + k)
                    elif isinstance(item, Delta) and item.content:
                        if item_id is None:
                            item_id = new_id("msg")
                            yield event("response.output_item.added", output_index=index,
                                        item=message_item(item_id, "", "in_progress"))
                            yield event("response.content_part.added", item_id=item_id,
                                        output_index=index, content_index=0,
                                        part=output_text(""))
                        text.append(item.content)
                        yield event("response.output_text.delta", item_id=item_id,
                                    output_index=index, content_index=0, delta=item.content)
                    elif isinstance(item, ChatResult):
                        result = item
                    more, item = await pump.next()
            finally:
                pump.cancel()
            assert result is not None
            self.usage[0] += result.prompt_tokens
            self.usage[1] += result.completion_tokens
            self.handoff = result.envelope.get("handoff") or self.handoff
            if result.finish_reason == "length":
                incomplete = "max_output_tokens"
            if item_id is None and not result.calls:  # an empty or handed-off answer
                item_id = new_id("msg")
                text = [result.content or ""]
                yield event("response.output_item.added", output_index=index,
                            item=message_item(item_id, "", "in_progress"))
                yield event("response.content_part.added", item_id=item_id, output_index=index,
                            content_index=0, part=output_text(""))
                if text[0]:
                    yield event("response.output_text.delta", item_id=item_id,
                                output_index=index, content_index=0, delta=text[0])
            if item_id is not None:
                whole = "".join(text)
                yield event("response.output_text.done", item_id=item_id, output_index=index,
                            content_index=0, text=whole)
                yield event("response.content_part.done", item_id=item_id, output_index=index,
                            content_index=0, part=output_text(whole))
                done = message_item(item_id, whole)
                yield event("response.output_item.done", output_index=index, item=done)
                self.output.append(done)
                self.messages.append({"role": "assistant", "content": whole})
            ran_mcp, stop = False, False
            calls = []
            for k, (name, arguments) in enumerate(result.calls):
                if self.plan.owns(name):
                    call = self.plan.call(name, arguments)
                    if call.needs_approval:
                        stop = True
                        async for out in self.request_approval(event, call):
                            yield out
                    else:
                        ran_mcp = True
                        async for out in self.run_mcp(event, call):
                            yield out
                    continue
                stop = True  # the client runs function calls: the response ends here
                call_id = f"{job.call_id(k)}"
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": name, "arguments": arguments}})
                for out in self.function_call(event, call_id, name, arguments, live.get(k)):
                    yield out
            if calls:
                self.messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            if stop or not ran_mcp or incomplete or round_number == MAX_MCP_ROUNDS:
                break
        status = "incomplete" if incomplete else "completed"
        final = self.response(status, incomplete)
        if self.req.store is not False:
            self.store.put(self.id, self.messages, final)
        yield event(f"response.{status}", response=final)

    def function_call(self, event: EventCounter, call_id: str, name: str, arguments: str,
                      live: list | None = None) -> list[dict[str, Any]]:
        """The events that finish a call: all of them for a call the stream could not follow
        (its arguments as one delta), the rest for one streamed live (`live`)."""
        index = len(self.output)
        item_id = live[0] if live else new_id("fc")
        done = function_call_item(item_id, call_id, name, arguments)
        self.output.append(done)
        events = [] if live else [event("response.output_item.added", output_index=index,
                                        item=function_call_item(item_id, call_id, name, "",
                                                                "in_progress"))]
        if not (live and live[1]):
            events.append(event("response.function_call_arguments.delta", item_id=item_id,
                                output_index=index, delta=arguments))
        return [*events, event("response.function_call_arguments.done", item_id=item_id,
                               output_index=index, arguments=arguments),
                event("response.output_item.done", output_index=index, item=done)]

    async def run_mcp(self, event: EventCounter, call: Any) -> AsyncIterator[dict[str, Any]]:
        """Run one MCP call on its server: an `mcp_call` item, its result fed back."""
        index = len(self.output)
        yield event("response.output_item.added", output_index=index,
                    item=call.item("in_progress"))
        yield event("response.mcp_call.in_progress", output_index=index, item_id=call.id)
        await call.run()
        kind = "failed" if call.error is not None else "completed"
        yield event(f"response.mcp_call.{kind}", output_index=index, item_id=call.id)
        done = call.item(kind)
        self.output.append(done)
        self.messages.extend(call.messages())
        yield event("response.output_item.done", output_index=index, item=done)

    async def request_approval(self, event: EventCounter, call: Any
                               ) -> AsyncIterator[dict[str, Any]]:
        index = len(self.output)
        item = call.approval_item()
        self.output.append(item)
        yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)

    def close(self) -> None:
        self.plan.close()


def install_responses(app: FastAPI, as_api_error: Any, *, mcp: Any = None,
                      mcp_hosts: tuple[str, ...] = (), store: ResponseStore | None = None
                      ) -> None:
    """The `/v1/responses` route on `app` (whose state holds the engine, pool and metrics);
    `as_api_error` maps an exception to the error a stream reports in-band (`app.py`)."""
    app.state.responses = store or ResponseStore()
    app.state.mcp_bridge = McpBridge(mcp, mcp_hosts)

    @app.post("/v1/responses", response_model=None)
    async def create_response(req: ResponsesRequest, request: Request) -> Response:
        app.state.engine.check_model(req.model)
        check_refused(req)
        check_tool_types(req.tools)
        # a server_url connection (when allowed) may take seconds: not on the event loop
        plan = await asyncio.to_thread(app.state.mcp_bridge.plan, req.tools)
        try:
            run = ResponseRun(app, req, plan)
        except BaseException:
            plan.close()
            raise
        events = run.events()
        if not req.stream:
            try:
                final: dict[str, Any] = {}
                async for event in events:
                    final = event
            finally:
                run.close()
            return JSONResponse(final["response"],
                                headers=handoff_headers({"handoff": run.handoff}))
        try:
            first = await events.__anext__()
        except BaseException:
            run.close()
            raise
        return StreamingResponse(_sse(first, events, run, as_api_error),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})


async def _sse(first: dict[str, Any], events: AsyncIterator[dict[str, Any]],
               run: ResponseRun, as_api_error: Any) -> AsyncIterator[str]:
    try:
        yield _event(first)
        async for event in events:
            yield _event(event)
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        error = as_api_error(exc).body()["error"]
        yield _event({"type": "error", "code": error.get("code"), "message": error["message"],
                      "param": error.get("param")})
    finally:
        run.close()


def _event(payload: dict[str, Any]) -> str:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {data}\n\n"
