"""Pieces of the load benchmark (`bench/load.py`): `needlepoint serve` in a subprocess, one
timed request through the official `openai` async client, /proc readings, percentiles."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai

from .paths import REPO_ROOT

HOST = "127.0.0.1"  # loopback only, by design


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def proc_status(pid: int, field: str) -> int | None:
    """A `VmRSS`/`VmHWM` value of /proc/<pid>/status in bytes (None off Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Server:
    """`needlepoint serve` in a subprocess, stopped (by its own pid) on exit."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_WAIT_POLICY": "passive",
        }
        command = [
            sys.executable, "-m", "needlepoint", "serve",
            "--model", str(args.model),
            "--host", HOST,
            "--port", str(self.port),
            "--max-queue", str(args.max_queue),
            "--log-level", "warning",
        ]
        if args.workers:
            command += ["--workers", str(args.workers)]
        if not args.batching:
            command += ["--no-batching"]
        if not args.speculate:
            command += ["--no-speculate"]
        self.proc = subprocess.Popen(command, env=env, cwd=REPO_ROOT)
        self.base_url = f"http://{HOST}:{self.port}/v1"

    async def wait_ready(self, client: openai.AsyncOpenAI, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with status {self.proc.returncode}")
            try:
                await client.models.list()
                return
            except openai.APIConnectionError:
                await asyncio.sleep(0.2)
        raise RuntimeError("server did not become ready")

    def rss(self) -> int | None:
        return proc_status(self.proc.pid, "VmRSS")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)


async def health(client: openai.AsyncOpenAI) -> dict[str, Any]:
    return await client.get("/../health", cast_to=object)


async def one_request(
    client: openai.AsyncOpenAI, model: str, request: dict[str, Any], stream: bool
) -> tuple[float, list[tuple[str, str]], int]:
    """(seconds to the first streamed chunk or to the whole answer, calls, completion tokens);
    for a text answer the calls are `[("", text)]`."""
    start = time.perf_counter()
    if not stream:
        out = await client.chat.completions.create(model=model, **request)
        message = out.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        if not calls and message.content:
            calls = [("", message.content)]
        return time.perf_counter() - start, calls, out.usage.completion_tokens
    first = None
    parts: dict[int, list[str]] = {}
    text = ""
    tokens = 0
    response = await client.chat.completions.create(
        model=model, stream=True, stream_options={"include_usage": True}, **request
    )
    async for chunk in response:
        if first is None:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                entry = parts.setdefault(tc.index, ["", ""])
                entry[0] += tc.function.name or ""
                entry[1] += tc.function.arguments or ""
    calls = [(name, args) for _, (name, args) in sorted(parts.items())]
    if not calls and text:
        calls = [("", text)]
    return first or time.perf_counter() - start, calls, tokens
