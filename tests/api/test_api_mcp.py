"""MCP servers as tools (issue 29 item 1) against real MCP servers written with the `mcp`
package's server side (`tests/mcp_helpers.py`): stdio subprocesses and a streamable-HTTP
server on 127.0.0.1, including ones that crash and hang. Every wait is bounded by the
servers' `timeout` / `start_timeout`, so a broken server fails a test instead of hanging it."""

from __future__ import annotations

import json
import time

import pytest
from conftest import REPO_ROOT
from mcp_helpers import HttpServer, stdio_server

from needlepoint.api.mcp_config import load_config
from needlepoint.api.mcp_tools import McpTools
from needlepoint.api.needle import Needle
from needlepoint.errors import McpConfigError, McpServerError

EXAMPLE = REPO_ROOT / "examples" / "mcp.json"
CALL_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def pair():
    """Two servers offering the same tools: every name clashes."""
    with McpTools({"mcpServers": {"a": stdio_server(timeout=CALL_TIMEOUT),
                                  "b": stdio_server(timeout=CALL_TIMEOUT)}}) as tools:
        yield tools


def test_clashing_names_are_prefixed_with_the_server(pair):
    names = {(t.name, t.server, t.tool) for t in pair.tools}
    assert ("a_set_alarm", "a", "set_alarm") in names
    assert ("b_set_alarm", "b", "set_alarm") in names
    assert all(t.name == f"{t.server}_{t.tool}" for t in pair.tools)
    spec = next(s for s in pair.specs() if s.name == "a_set_alarm")
    assert spec.parameters["required"] == ["time"]  # the server's own input schema


def test_structured_text_and_error_results(pair):
    alarm = pair.call("a_set_alarm", {"time": "06:45", "label": "work"})
    assert alarm == {"name": "a_set_alarm", "arguments": {"time": "06:45", "label": "work"},
                     "server": "a", "result": {"status": "set", "time": "06:45",
                                               "label": "work"}}
    assert pair.call("b_get_time", {"city": "Oslo"})["result"] == {"result": "12:00 in Oslo"}
    failed = pair.call("a_fail", {"reason": "no clock"})
    assert "result" not in failed and "cannot do it: no clock" in failed["error"]


def test_a_hanging_call_is_a_typed_error_naming_the_server(pair):
    start = time.monotonic()
    with pytest.raises(McpServerError, match="'b' did not answer 'hang' within 3 s") as info:
        pair.call("b_hang", {})
    assert info.value.server == "b"
    assert time.monotonic() - start < CALL_TIMEOUT + 5
    assert pair.call("a_get_time", {"city": "Rome"})["result"] == {"result": "12:00 in Rome"}


def test_a_server_that_dies_mid_call_is_a_typed_error():
    with McpTools({"mcpServers": {"fragile": stdio_server(timeout=CALL_TIMEOUT)}}) as tools:
        with pytest.raises(McpServerError, match="'fragile' failed during 'crash'"):
            tools.call("crash", {})
        with pytest.raises(McpServerError, match="'fragile'"):
            tools.call("get_time", {"city": "Oslo"})  # fails fast: the server is gone


@pytest.mark.parametrize("mode, message", [("hang", "did not start and list its tools within"),
                                           ("crash", "failed to start")])
def test_a_server_that_does_not_start_is_a_typed_error(mode, message):
    start = time.monotonic()
    config = {"mcpServers": {"broken": stdio_server("--start", mode, start_timeout=3)}}
    with pytest.raises(McpServerError, match=f"'broken' {message}") as info:
        McpTools(config)
    assert info.value.server == "broken"
    assert time.monotonic() - start < 30


def test_a_missing_command_or_closed_port_is_a_typed_error():
    with pytest.raises(McpServerError, match="'ghost' failed to start"):
        McpTools({"mcpServers": {"ghost": {"command": "/nonexistent/mcp-server"}}})
    with pytest.raises(McpServerError, match="'down' failed to start"):
        McpTools({"mcpServers": {"down": {"url": "http://127.0.0.1:9/mcp", "timeout": 3}}})


def test_streamable_http_server_with_headers():
    with HttpServer() as server, McpTools({"mcpServers": {"web": {
            "url": server.url, "headers": {"X-Team": "alarms"},
            "timeout": CALL_TIMEOUT}}}) as tools:
        assert {t.name for t in tools.tools} >= {"set_alarm", "get_time", "fail"}
        assert tools.call("set_alarm", {"time": "07:00"})["result"]["status"] == "set"
        with pytest.raises(McpServerError, match="'web' did not answer 'hang'"):
            tools.call("hang", {})
        assert tools.call("get_time", {"city": "Oslo"})["result"] == {"result": "12:00 in Oslo"}


def test_needle_runs_the_example_server_on_the_demo_model():
    """The README's `needlepoint run "wake me up at 06:45" --mcp examples/mcp.json`."""
    with Needle(mcp=EXAMPLE) as needle:
        assert [s.name for s in needle.tools] == ["set_alarm", "get_weather"]
        envelope = needle.run("wake me up at 06:45")
    assert envelope["function_calls"] == [{"name": "set_alarm", "arguments": {"time": "06:45"}}]
    assert envelope["results"] == [{"name": "set_alarm", "arguments": {"time": "06:45"},
                                    "server": "alarms",
                                    "result": {"status": "set", "time": "06:45", "label": ""}}]
    assert 0.0 < envelope["confidence"] <= 1.0  # no head: the token measure
    assert envelope["confidence_source"] == "tokens"
    assert needle.mcp.closed


def test_a_local_tool_keeps_its_name_and_the_server_tool_is_prefixed():
    def set_alarm(time: str) -> str:
        """Set an alarm (the local one)."""
        return f"local {time}"

    with Needle(tools=[set_alarm], mcp=EXAMPLE) as needle:
        assert [s.name for s in needle.tools] == ["set_alarm", "alarms_set_alarm", "get_weather"]


def test_execute_raises_when_the_server_dies_but_reports_tool_errors(pair):
    needle = Needle(mcp=pair)  # the caller's connections: Needle does not close them
    failed = needle.execute({"name": "a_fail", "arguments": {"reason": "x"}})
    assert failed["server"] == "a" and "cannot do it: x" in failed["error"]
    with McpTools({"mcpServers": {"z": stdio_server(timeout=CALL_TIMEOUT)}}) as doomed:
        needle = Needle(mcp=doomed)
        with pytest.raises(McpServerError, match="'z'"):
            needle.execute({"name": "crash", "arguments": {}})
    needle.close()
    assert not pair.closed


def test_config_errors_name_the_file_and_server(tmp_path):
    bad = tmp_path / "mcp.json"
    bad.write_text("{not json")
    with pytest.raises(McpConfigError, match="not valid UTF-8 JSON"):
        load_config(bad)
    for entry, message in [({"command": "x", "url": "http://h"}, "either"),
                           ({"command": "x", "port": 1}, "unknown key"),
                           ({"url": "ftp://h"}, "http:// or https://"),
                           ({"command": "x", "args": "a b"}, "list of strings"),
                           ({"command": "x", "timeout": 0}, "timeout must be")]:
        bad.write_text(json.dumps({"mcpServers": {"s": entry}}))
        with pytest.raises(McpConfigError, match=f"server 's': .*{message}"):
            load_config(bad)
    with pytest.raises(McpConfigError, match="mcpServers"):
        load_config({"servers": {}})
    servers = load_config(EXAMPLE)
    assert servers[0].cwd == str(EXAMPLE.parent) and servers[0].transport == "stdio"
    assert load_config({"mcpServers": {"off": {"command": "x", "disabled": True}}}) == []
