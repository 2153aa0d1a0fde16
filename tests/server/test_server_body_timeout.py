"""A client that sends the headers and then stalls the body (or drips it) gets a 408 and
its connection closed after the body timeout, instead of holding it forever."""

# ruff: noqa: F811

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
from server_helpers import MODEL_ID, ServerThread, model, user  # noqa: F401

from needlepoint.server import create_app

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def slow_server(model) -> Iterator[ServerThread]:
    app = create_app(model, workers=2, model_name=MODEL_ID, body_timeout_s=TIMEOUT_S)
    with ServerThread(app) as running:
        yield running


def stalled_request(server: ServerThread, drip: bool) -> tuple[bytes, float]:
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL_ID, "messages": user("hi")}).encode()
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
        received = b""
        sent = 5
        while True:
            # one byte every 0.3 s (never completes in time), until the answer starts: a byte
            # sent after the server closed would be answered by a reset
            if drip and not received and sent < len(body) - 1:
                sock.sendall(body[sent:sent + 1])
                sent += 1
                sock.settimeout(0.3)
            else:
                sock.settimeout(30)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:  # closed with one of our bytes unread: closed
                break
            if not chunk:  # the server closed the connection
                break
            received += chunk
    return received, time.monotonic() - start


@pytest.mark.parametrize("drip", [False, True])
def test_a_stalled_body_gets_408_and_the_connection_closes(slow_server, drip):
    received, seconds = stalled_request(slow_server, drip)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and "1 seconds" in error["message"]
    assert TIMEOUT_S <= seconds < TIMEOUT_S + 10
    # The server goes on serving.
    assert slow_server.client().models.list().data[0].id == MODEL_ID
