"""MCP servers as tools, with the `mcp` package's client.

    tools = McpTools("mcp.json")           # starts / connects every server, lists their tools
    needle = Needle(tools=[...], mcp=tools) # or mcp="mcp.json": Needle starts its own
    tools.call("set_alarm", {"time": "06:45"})  # -> {"result": ...} or {"error": ...}
    tools.close()

The servers run on one asyncio loop in a daemon thread of their own (needlepoint is
synchronous); each server's connection is one task that holds the `mcp.Client` open until
`close`, so calls from any thread go through `asyncio.run_coroutine_threadsafe`.

Tools come from `list_tools` and become `ToolSpec`s through `from_dict`: the same schema checks
and grammar as any tool. A tool name offered by two servers (or by a local Python tool) is
prefixed with its server name, `server_tool`. A call's result is the structured content when
the server gives one, else the text of its content blocks (JSON-decoded when it is JSON);
`isError` becomes an `McpToolError`, which `Needle.execute` hands to the model as the call's
error. A server that does not start, dies or does not answer within its `timeout` raises
`McpServerError` naming it: never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..errors import McpConfigError, McpServerError, NeedlepointError, ToolSchemaError
from .mcp_config import ServerConfig, load_config
from .tools import ToolSpec, from_dict

STOP_WAIT_S = 3.0  # a server that answers closes in well under this
CLOSE_GRACE_S = 10.0  # the mcp client's own bounded shutdown (stdin close, TERM, KILL)


class McpToolError(NeedlepointError):
    """An MCP tool answered with `isError`: a tool result the model sees, not a crash."""


@dataclass(frozen=True)
class McpTool:
    """One MCP tool as offered to the model: `name` (prefixed on a clash), its server, the
    server's own name for it, and its schema."""

    name: str
    server: str
    tool: str
    description: str
    parameters: dict[str, Any]

    def listing(self) -> dict[str, Any]:
        return {"name": self.name, "server": self.server, "tool": self.tool,
                "description": self.description, "parameters": self.parameters}


class McpTools:
    """Connections to the servers of one `mcp.json` (path or dict) and their tools."""

    def __init__(self, config: str | Path | Mapping[str, Any], *, timeout: float | None = None,
                 reserved: Iterable[str] = ()) -> None:
        self.servers = {s.name: s for s in load_config(config, timeout=timeout)}
        try:
            import mcp  # noqa: F401 - the client lives in the `mcp` extra
        except ImportError:
            raise McpConfigError("MCP servers need the `mcp` package: pip install "
                                 "'needlepoint[mcp]'") from None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="needlepoint-mcp")
        self._thread.start()
        self._clients: dict[str, Any] = {}
        self._stops: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._dead: dict[str, str] = {}
        self.closed = False
        try:
            started = [(server, self._start(server)) for server in self.servers.values()]
            listed = {server.name: self._ready(server, ready) for server, ready in started}
            self.tools = _named(listed, set(reserved))
        except BaseException:
            self.close()
            raise
        self._by_name = {t.name: t for t in self.tools}

    # ------------------------------------------------------------------ connecting
    def _start(self, server: ServerConfig) -> asyncio.Future:
        """Start the server's connection task (all servers start at once)."""
        ready: asyncio.Future = self._submit(_make_future()).result()
        stop: asyncio.Event = self._submit(_make_event()).result()
        self._stops[server.name] = stop
        self._tasks[server.name] = self._submit(_spawn(self._hold(server, ready, stop))).result()
        return ready

    def _ready(self, server: ServerConfig, ready: asyncio.Future) -> list[Any]:
        """The server's tools once it has started, or McpServerError naming it."""
        try:
            client, tools = self._submit(_wait(ready, server.start_timeout)).result()
        except TimeoutError:
            self._loop.call_soon_threadsafe(self._tasks[server.name].cancel)
            raise McpServerError(f"MCP server {server.name!r} did not start and list its tools "
                                 f"within {server.start_timeout:g} s", server.name) from None
        except Exception as error:
            raise McpServerError(f"MCP server {server.name!r} failed to start: "
                                 f"{_describe(error)}", server.name) from None
        self._clients[server.name] = client
        return tools

    async def _hold(self, server: ServerConfig, ready: asyncio.Future,
                    stop: asyncio.Event) -> None:
        """The server's connection, open from the first listing until `stop` is set."""
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(
                    Client(await _target(server, stack), read_timeout_seconds=server.timeout))
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                ready.set_result((client, tools))
                await stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception)
                                    else RuntimeError("cancelled"))
                ready.exception()  # retrieved here: the waiter may have timed out
            self._dead.setdefault(server.name, _describe(error))
            if not isinstance(error, Exception):
                raise

    def _submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # ------------------------------------------------------------------ calling
    def specs(self) -> list[ToolSpec]:
        """Every MCP tool as a `ToolSpec` whose function calls it on its server."""
        specs = []
        for entry in self.tools:
            try:
                spec = from_dict({"name": entry.name, "description": entry.description,
                                  "parameters": entry.parameters})
            except ToolSchemaError as error:
                raise ToolSchemaError(f"MCP server {entry.server!r}: {error}") from None
            function = functools.partial(self._invoke, entry.name)
            specs.append(ToolSpec(spec.name, spec.description, spec.parameters, function))
        return specs

    def _invoke(self, name: str, **arguments: Any) -> Any:
        return self.result_of(name, self.call_raw(name, arguments))

    def call(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Run one call: `{"name", "arguments", "server", "result" | "error"}`. A tool's
        `isError` is an `error` entry; a server failure raises `McpServerError`."""
        tool = self.tool(name)
        entry: dict[str, Any] = {"name": name, "arguments": dict(arguments),
                                 "server": tool.server}
        try:
            entry["result"] = self._invoke(name, **arguments)
        except McpToolError as error:
            entry["error"] = str(error)
        return entry

    def server_of(self, name: str) -> str | None:
        """The server of the MCP tool called `name`; None when no MCP tool has that name."""
        tool = self._by_name.get(name)
        return None if tool is None else tool.server

    def tool(self, name: str) -> McpTool:
        if name not in self._by_name:
            raise NeedlepointError(f"no MCP tool named {name!r}")
        return self._by_name[name]

    def call_raw(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """The `CallToolResult` of one call (McpServerError when the server fails)."""
        tool = self.tool(name)
        server = self.servers[tool.server]
        if self.closed:
            raise McpServerError(f"MCP server {server.name!r} is closed", server.name)
        if server.name in self._dead:
            raise McpServerError(f"MCP server {server.name!r} is gone: "
                                 f"{self._dead[server.name]}", server.name)
        client = self._clients[server.name]
        future = self._submit(asyncio.wait_for(client.call_tool(tool.tool, dict(arguments)),
                                               server.timeout))
        try:
            return future.result(server.timeout + CLOSE_GRACE_S)
        except TimeoutError:
            future.cancel()
            raise McpServerError(f"MCP server {server.name!r} did not answer {tool.tool!r} "
                                 f"within {server.timeout:g} s", server.name) from None
        except Exception as error:
            raise McpServerError(f"MCP server {server.name!r} failed during {tool.tool!r}: "
                                 f"{_describe(error)}", server.name) from None

    @staticmethod
    def result_of(name: str, result: Any) -> Any:
        """A `CallToolResult` as the value fed back to the model (or McpToolError)."""
        texts = [getattr(block, "text", None) for block in result.content]
        text = "\n".join(t for t in texts if t is not None)
        if result.is_error:
            raise McpToolError(text or f"the tool {name!r} failed")
        if result.structured_content is not None:
            return result.structured_content
        try:
            return json.loads(text)
        except ValueError:
            return text

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Stop every server (bounded) and the loop thread. Idempotent."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(BaseException):
            self._submit(_close_all(list(self._stops.values()), list(self._tasks.values()))
                         ).result(STOP_WAIT_S + 2 * CLOSE_GRACE_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_GRACE_S)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> McpTools:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def attach(mcp: Any, local: list[ToolSpec], timeout: float | None = None
           ) -> tuple[McpTools | None, bool, list[ToolSpec]]:
    """`Needle(mcp=...)`: (the connections, whether Needle owns them, the tools to add). `mcp`
    is None, an `McpTools` (the caller's, not closed by Needle), or an `mcp.json` path/dict
    (connected now; a name a local tool has is prefixed with the server name)."""
    if mcp is None:
        return None, False, []
    if isinstance(mcp, McpTools):
        return mcp, False, mcp.specs()
    tools = McpTools(mcp, timeout=timeout, reserved=[spec.name for spec in local])
    try:
        return tools, True, tools.specs()
    except BaseException:
        tools.close()
        raise


async def _wait(future: asyncio.Future, timeout: float) -> Any:
    return await asyncio.wait_for(asyncio.shield(future), timeout)


async def _spawn(coro: Any) -> asyncio.Task:
    return asyncio.ensure_future(coro)


async def _close_all(stops: list[asyncio.Event], tasks: list[asyncio.Task]) -> None:
    """Ask every connection to close, then cancel the ones stuck in a call (the mcp client
    then stops its server process: stdin closed, TERM, KILL, each wait bounded)."""
    for stop in stops:
        stop.set()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=STOP_WAIT_S)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=CLOSE_GRACE_S)


async def _make_future() -> asyncio.Future:
    return asyncio.get_running_loop().create_future()


async def _make_event() -> asyncio.Event:
    return asyncio.Event()


async def _target(server: ServerConfig, stack: contextlib.AsyncExitStack) -> Any:
    """What `mcp.Client` connects to: stdio parameters, or an HTTP transport with headers."""
    if server.command is not None:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=server.command, args=list(server.args),
                                       env=dict(server.env) or None, cwd=server.cwd)
        return stdio_client(params, errlog=_server_errlog())
    assert server.url is not None
    if not server.headers:
        return server.url
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = await stack.enter_async_context(create_mcp_http_client(headers=dict(server.headers)))
    return streamable_http_client(server.url, http_client=http)


def _server_errlog() -> TextIO:
    """Where a stdio server's stderr goes: ours, or the process's own stderr when ours has no
    file descriptor for the child to inherit (a notebook's or a test's captured stream)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return sys.__stderr__
    return sys.stderr


def _named(listed: Mapping[str, list[Any]], reserved: set[str]) -> list[McpTool]:
    """The tools of every server, a name two servers share (or a local tool has) prefixed
    with the server name."""
    owners: dict[str, int] = {}
    for tools in listed.values():
        for tool in tools:
            owners[tool.name] = owners.get(tool.name, 0) + 1
    named = []
    for server, tools in listed.items():
        for tool in tools:
            clash = owners[tool.name] > 1 or tool.name in reserved
            name = f"{server}_{tool.name}" if clash else tool.name
            named.append(McpTool(name, server, tool.name, tool.description or "",
                                 dict(tool.input_schema or {"type": "object"})))
    return named


def _describe(error: BaseException) -> str:
    """One line for an exception, unwrapping exception groups (anyio task groups)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
