"""Server pieces without the in-process server: the incremental tool-call splitter used
for streaming, and `needlepoint serve` as a subprocess.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import openai
import pytest
from conftest import toy_model_path
from server_helpers import MODEL_ID, free_text

from needlepoint.server.streaming import ARGS, START, CallSplitter, merge_args


# ---------------------------------------------------------------------------------------------
# Pieces: the incremental call splitter, the command line
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_call_splitter(step: int) -> None:
    calls = [
        {"name": "f", "arguments": {"a": 1, "b": 'x}\\"y', "c": [1, {"d": None}]}},
        {"arguments": {"z": True}, "name": "g"},  # arguments before the name
        {"name": "h"},  # no arguments at all
    ]
    text = json.dumps(calls, separators=(",", ":"))
    splitter = CallSplitter()
    events = []
    for i in range(0, len(text), step):
        events += splitter.feed(text[i : i + step])
    events = merge_args(events)
    starts = [(i, name) for kind, i, name in events if kind == START]
    assert starts == [(0, "f"), (1, "g"), (2, "h")]
    args = {i: "" for i, _ in starts}
    for kind, i, piece in events:
        if kind == ARGS:
            args[i] += piece
    assert json.loads(args[0]) == calls[0]["arguments"]
    assert json.loads(args[1]) == calls[1]["arguments"]
    assert args[2] == ""


def test_cli_serve_subprocess() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "needlepoint", "serve", "--model", str(toy_model_path()),
         "--port", str(port), "--workers", "1", "--log-level", "warning"],
        env=env,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-",
                               max_retries=0)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "server exited"
            try:
                assert [m.id for m in client.models.list().data] == [MODEL_ID]
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        out = free_text(client, "hello", max_tokens=3)
        assert out.choices[0].finish_reason == "length"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
