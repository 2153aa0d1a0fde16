"""Real MCP servers for the MCP tests (issue 29), written with the `mcp` package's server side,
and the helpers that start them.

Run as a script it is a server: stdio by default, streamable HTTP on 127.0.0.1 with
`--http PORT`; `--start hang` never answers the handshake, `--start crash` exits at once.
Its tools: `set_alarm` (structured result), `get_time` (plain text), `fail` (an `isError`
result), `crash` (the process exits mid-call) and `hang` (never answers).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()


def stdio_server(*args: str, timeout: float = 5.0, start_timeout: float = 60.0) -> dict:
    """An mcp.json entry that runs this file as a stdio server."""
    return {"command": sys.executable, "args": [str(SCRIPT), *args], "timeout": timeout,
            "start_timeout": start_timeout}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]



def stop_process(process: subprocess.Popen, wait_s: float, kill_wait_s: float) -> None:
    """Terminate `process` and wait `wait_s` for it; kill it if it is still there (then wait
    `kill_wait_s`): no test server outlives its test."""
    process.terminate()
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(kill_wait_s)

class HttpServer:
    """This file as a streamable-HTTP server on 127.0.0.1 (a subprocess, stopped on exit)."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.args = args
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> HttpServer:
        self.process = subprocess.Popen([sys.executable, str(SCRIPT), "--http", str(self.port),
                                         *self.args], stderr=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the MCP test server exited")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("the MCP test server did not listen within 30 s")

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        stop_process(self.process, 10, 10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    parser.add_argument("--start", choices=["ok", "hang", "crash"], default="ok")
    args = parser.parse_args()
    if args.start == "crash":
        sys.exit(3)
    if args.start == "hang":
        time.sleep(3600)
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("test-alarms", log_level="WARNING")

    @server.tool()
    def set_alarm(time: str, label: str = "") -> dict:
        """Set an alarm at a time of day."""
        return {"status": "set", "time": time, "label": label}

    @server.tool()
    def get_time(city: str) -> str:
        """The local time in a city."""
        return f"12:00 in {city}"

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails with the given reason."""
        raise ToolError(f"cannot do it: {reason}")

    @server.tool()
    def crash() -> str:
        """Kills the server process."""
        os._exit(1)

    @server.tool()
    async def hang() -> str:
        """Never answers."""
        import anyio

        await anyio.sleep(3600)
        return "never"

    sys.path.insert(0, str(SCRIPT.parents[1] / "examples"))
    from mcp_alarm_server import serve

    serve(server, args.http)


if __name__ == "__main__":
    main()
