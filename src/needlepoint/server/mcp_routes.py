"""The MCP servers of `serve --mcp` for the playground:
`GET /v1/needlepoint/mcp/tools` lists every tool with its server (the names the model sees),
`POST /v1/needlepoint/mcp/call` `{"name", "arguments"}` runs one call on its server and
answers `{"name", "arguments", "server", "result" | "error"}` (a tool's `isError` is an
`error`; a server that fails or does not answer in time is a 502 naming it). Both need an API
key like every `/v1/*` route.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from ..errors import McpServerError, NeedlepointError
from .errors import ApiError


class McpCallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    arguments: dict[str, Any] = {}


def install_mcp_routes(app: FastAPI, mcp: Any) -> None:
    @app.get("/v1/needlepoint/mcp/tools")
    async def mcp_tools() -> dict[str, Any]:
        tools = [] if mcp is None else [t.listing() for t in mcp.tools]
        return {"object": "list", "data": tools}

    @app.post("/v1/needlepoint/mcp/call")
    async def mcp_call(req: McpCallRequest) -> dict[str, Any]:
        if mcp is None:
            raise ApiError(404, "No MCP servers are configured (serve --mcp mcp.json).",
                           type="not_found_error", code="no_mcp_servers")
        try:
            mcp.tool(req.name)
        except NeedlepointError as error:
            raise ApiError(404, str(error), type="not_found_error", param="name") from None
        try:
            return await asyncio.to_thread(mcp.call, req.name, req.arguments)
        except McpServerError as error:
            raise ApiError(502, str(error), type="server_error", code="mcp_server_error") \
                from None
