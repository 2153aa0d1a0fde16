"""The browser playground at `/`: static files shipped in the package (`server/static/`).

No build step and nothing from the internet: a hand-written HTML page, one script and one
style sheet, served from the package with a Content-Security-Policy that lets the page reach
only this server. The page talks to the server's own OpenAI endpoints
(`/v1/chat/completions`, streamed; `/v1/models`), sending the API key typed into its key
field. `tools.json` is `examples/tools.json`, the page's preloaded tools (a test keeps the
two equal).
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from .errors import ApiError

# name -> media type: only these files are served (no path from the URL reaches the disk)
FILES = {
    "index.html": "text/html; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "playground_mcp.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
    "tools.json": "application/json",
}
# Only this server: scripts, styles, fetches; no inline code, no frames, no other origin.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def static_file(name: str) -> bytes:
    if name not in FILES:
        raise ApiError(404, f"No such playground file: {name!r}.", type="not_found_error")
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _response(name: str) -> Response:
    return Response(static_file(name), media_type=FILES[name],
                    headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache",
                             "X-Content-Type-Options": "nosniff"})


def install_playground(app: FastAPI) -> None:
    """`GET /` (the page) and `GET /playground/{name}` (its script, style and tools)."""

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def playground() -> Response:
        return _response("index.html")

    @app.get("/playground/{name}", include_in_schema=False)
    async def playground_file(name: str) -> Response:
        return _response(name)
