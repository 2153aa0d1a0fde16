"""The middlewares inside `observe.py`'s: the last-line 500 (`CatchAllMiddleware`) and the
request body's size and time limits (`BodyLimitMiddleware`: 413, 408). They
sit beside `observe.py` (ids, access log, metrics) and `auth.py` (API keys), not in `app.py`.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import as_api_error, body_timeout, body_too_large
from .settings import DEFAULT_BODY_TIMEOUT_S


class CatchAllMiddleware:
    """The last line: an exception no handler took becomes a 500 with an error object.

    Only bugs get here (client errors are `ApiError`s or validation errors). Once a response
    has started (a stream), nothing more can be sent, and the exception is only logged.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            error = as_api_error(exc)  # logs the traceback
            if not started:
                await error.response()(scope, receive, send)


class BodyLimitMiddleware:
    """Reads the whole request body up front and refuses it (413) past `limit` bytes.

    Buffering is cheap at these sizes and makes the check independent of Content-Length
    (chunked uploads are counted too). The rest of an oversized body is still drained, so the
    client gets the 413 instead of a reset connection, but only up to a bound, after which
    the connection is dropped rather than reading an endless body. A body not complete
    `timeout` seconds after the first read gets a 408 (a client that sends the headers and
    stalls cannot hold its connection forever).
    """

    DRAIN_FACTOR = 64

    def __init__(self, app: ASGIApp, limit: int,
                 timeout: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        too_big = declared is not None and declared > self.limit
        chunks: list[bytes] = []
        size = 0
        more = True
        deadline = time.monotonic() + self.timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                await body_timeout(self.timeout).response()(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            more = message.get("more_body", False)
            if size > self.limit:
                too_big = True
            if too_big:
                if size > self.limit * self.DRAIN_FACTOR:
                    break
                continue
            chunks.append(body)
        if too_big:
            await body_too_large(self.limit).response()(scope, receive, send)
            return
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as ASGI expects

    return replay
