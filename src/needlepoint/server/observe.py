"""The outermost middleware: a request id on every response, the access log, HTTP metrics.

Every response carries `x-request-id`: the client's own when it sent a sane one (1-128 of
`A-Z a-z 0-9 . _ : -`), else a fresh random one. The access log (logger
`needlepoint.access`, one INFO line per request, written when the response's last byte has
gone) carries the same id, so a client's report can be matched to the server's line.
"""

from __future__ import annotations

import logging
import re
import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import Metrics

REQUEST_ID_HEADER = b"x-request-id"
_SANE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
UNMATCHED = "(unmatched)"  # the route label of paths no route serves (404s): bounded labels
UNAUTHORIZED = "(unauthorized)"  # requests the API key check refused before any route
# The method label: HTTP's standard methods, anything else (a client may send any token) as
# one value, so the label set cannot grow with what clients invent.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE",
                     "CONNECT"})
OTHER_METHOD = "(other)"

access_log = logging.getLogger("needlepoint.access")


def request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER and _SANE_ID.fullmatch(value):
            return value.decode("ascii")
    return f"req_{secrets.token_hex(12)}"


def route_of(scope: Scope, status: int) -> str:
    """The route's path template (bounded label values); refused before routing: a label
    of its own."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    return UNAUTHORIZED if status == 401 else UNMATCHED


class ObserveMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        scope.setdefault("state", {})["request_id"] = rid
        start = time.perf_counter()
        status = 500  # what the client gets if the app fails before answering
        logged = False

        def finish() -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            seconds = time.perf_counter() - start
            method = scope.get("method", "")
            label = method if method in METHODS else OTHER_METHOD
            self.metrics.observe_http(route_of(scope, status), label, status, seconds)
            client = scope.get("client") or ("-", 0)
            access_log.info('%s:%s "%s %s" %d %.1fms request_id=%s', client[0], client[1],
                            method, scope.get("path", ""), status, seconds * 1e3, rid)

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != REQUEST_ID_HEADER]
                headers.append((REQUEST_ID_HEADER, rid.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finish()

        try:
            await self.app(scope, receive, observed_send)
        finally:
            finish()  # a response cut short (client gone, error mid-stream) is still counted
