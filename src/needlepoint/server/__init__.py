"""needlepoint's OpenAI-compatible HTTP server (`needlepoint serve`; needs the `server` extra).

    needlepoint serve --model M.cact [--host 127.0.0.1 --port 8000 --workers N
                      --max-queue Q --max-body-bytes B --max-kv-bytes K --step-tokens T
                      --no-batching --api-key KEY]

Endpoints:

* `POST /v1/chat/completions`: messages + `tools`/`tool_choice`; calls come back in OpenAI's
  `tool_calls` form (arguments as JSON text), `finish_reason` "tool_calls" / "stop" /
  "length", `usage` token counts, the think block as `reasoning_content`. `stream: true`
  sends server-sent events as tokens are decoded (tool-call arguments in pieces), then
  `[DONE]`. Honoured: `temperature`, `top_p`, `seed`, `max_tokens`/`max_completion_tokens`,
  and `top_k` as an extension. Unset `temperature` means greedy (Needle's default), not
  OpenAI's 1.0. `tool_choice`: "auto" (default), "none" (no tools shown), "required" (a call
  is forced), or a named function (only that tool is shown, and a call is forced).
* `POST /v1/needlepoint/complete`: `{"text", "tools", "system", ...}` -> the native envelope
  (type, function_calls, text, reasoning, confidence, timings).
* `GET /v1/models`, `GET /v1/models/{id}`: the one served model, named after its file stem.
* `GET /health`: status, worker count, requests in flight.
* `GET /metrics`: Prometheus text (`metrics.py`); `GET /`: the browser playground
  (`playground.py`, files in `static/`). Every response has an `x-request-id` (`observe.py`).

With `--api-key KEY` (repeatable) or `$NEEDLEPOINT_API_KEY`, every `/v1/*` route needs
`Authorization: Bearer KEY`, else 401 (`auth.py`); `/health`, `/metrics` and `/` stay open.
Details: `docs/server.md`.

Message mapping (see `client_chat.py`, `api/chat.py`): system/developer messages -> the
system text; the first user message -> the query with the tools; earlier assistant answers
and `tool` results -> later turns, results as `<tool_result>[...]</tool_result>`.

Concurrency: one model, loaded once; each request builds its own `Needle` (own session) on
one of `--workers` threads; up to `--max-queue` more wait; beyond that, 429. With
continuous batching (the default) the running requests' sessions belong to one scheduler
(`api/scheduler.py`) that runs the model for all of them in one batched call per engine
step; the KV caches are capped at `--max-kv-bytes` (429 past it), and a client that goes
away frees its session at the next step. Every client error is a 4xx with
`{"error": {"message", "type", "param", "code"}}`.

`create_app(model, ...)` builds the ASGI app; `serve(model, ...)` runs it with uvicorn;
`main(argv)` is the stand-alone command line. Imports are lazy, so `needlepoint --help`
works without the extra installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cli import main, serve

if TYPE_CHECKING:  # pragma: no cover
    from .app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'needlepoint.server' has no attribute {name!r}")


__all__ = ["create_app", "main", "serve"]
