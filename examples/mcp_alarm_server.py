"""An example MCP server (issue 29): the alarm and weather tools of `examples/tools.json`,
served over stdio (default) or streamable HTTP (`--http PORT`), written with the `mcp`
package's server side.

    needlepoint run "wake me up at 06:45" --mcp examples/mcp.json

Its tools only answer: no alarm rings and no weather service is asked.
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer

server = MCPServer("alarms", log_level="WARNING")  # the CLI shows only the answer


@server.tool()
def set_alarm(time: str, label: str = "") -> dict[str, str]:
    """Set an alarm at a time of day."""
    return {"status": "set", "time": time, "label": label}


@server.tool()
def get_weather(city: str, day: str = "today") -> str:
    """Get the weather forecast for a city."""
    return f"{day} in {city}: 21 C, clear"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT",
                        help="serve streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio")
    serve(server, parser.parse_args().http)


def serve(mcp_server: MCPServer, http: int | None) -> None:
    """Run `mcp_server` over stdio, or streamable HTTP on 127.0.0.1:`http`/mcp when a port is
    given (the tests' MCP server, `tests/mcp_helpers.py`, runs the same way)."""
    if http is None:
        mcp_server.run()
    else:
        mcp_server.run("streamable-http", host="127.0.0.1", port=http)


if __name__ == "__main__":
    main()
