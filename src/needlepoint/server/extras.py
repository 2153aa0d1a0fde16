"""The Responses, MCP and hand-off routes and hooks on an app built by `create_app`: `/v1/responses`
(`responses.py`), the MCP tools of `serve --mcp` (`responses_mcp.py`, `mcp_routes.py`) and
the confidence hand-off of every chat job (`handoff.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI

from .handoff import HandoffReview, handoff_headers
from .mcp_routes import install_mcp_routes
from .responses import install_responses

__all__ = ["handoff_headers", "install_extras"]


def install_extras(app: FastAPI, as_api_error: Callable[[BaseException], Any], *,
                   mcp: Any = None, mcp_hosts: Sequence[str] = (), handoff: Any = None) -> None:
    """`mcp`: an `api.mcp_tools.McpTools` (the caller closes it); `mcp_hosts`: the hosts a
    Responses request's `server_url` may name; `handoff`: an `api.handoff.Handoff`."""
    app.state.mcp = mcp
    if handoff is not None:
        app.state.engine.review = HandoffReview(handoff, app.state.metrics.registry)
    install_responses(app, as_api_error, mcp=mcp, mcp_hosts=tuple(mcp_hosts))
    install_mcp_routes(app, mcp)
