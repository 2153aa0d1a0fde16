"""The FastAPI application: routes, error mapping, body limit, streaming.

All state (the loaded model, the worker pool) lives on the app built by `create_app`, never in
module globals, so tests can run several servers side by side in one process.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import NeedlepointError
from .auth import ApiKeyMiddleware, KeyChecker
from .concurrency import ClientGone, EventPump, WorkerPool
from .engine import ChatResult, Delta, Engine
from .errors import ApiError, as_api_error, bad_request
from .extras import handoff_headers, install_extras
from .fields import validation_message
from .metrics import Metrics, StageCollector, install_metrics, stage_health
from .middleware import BodyLimitMiddleware, CatchAllMiddleware
from .observe import ObserveMiddleware
from .openapi import install_openapi
from .playground import install_playground
from .schemas import ChatCompletionRequest, ModelCard, ModelList, NativeCompleteRequest
from .settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_KV_BYTES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_SESSIONS,
    default_workers,
)
from .streaming import ChunkWriter


def create_app(
    model: Any,
    *,
    workers: int | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    model_name: str | None = None,
    needle_factory: Callable[..., Any] | None = None,
    batching: bool = True,
    max_kv_bytes: int | None = DEFAULT_MAX_KV_BYTES,
    step_tokens: int | None = None,
    speculate: bool = True,
    api_keys: Sequence[str] = (),
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    mcp: Any = None, mcp_hosts: Sequence[str] = (), handoff: Any = None,  # server/extras.py
) -> FastAPI:
    """Build the server for one model: a `.cact` path or an already loaded model object.

    `workers` requests decode at once; up to `max_queue` more wait, the rest get 429 (one
    `api.admission.Admission` decides: the scheduler reserves its sessions there, the worker
    pool takes each request's place there). With
    `batching` (default) they are the live sessions of one continuous-batching scheduler
    (`api/scheduler.py`: one model call per engine step for all of them, prefills chunked
    under `step_tokens` per step; default `workers` 32), their KV caches capped at
    `max_kv_bytes` in all (429 past it); without, `workers` threads each run their own
    request (default: one per CPU). Bodies over `max_body_bytes` get 413, bodies not
    received within `body_timeout_s` of the first read 408. `needle_factory` replaces
    `needlepoint.Needle` (tests inject a test double). `speculate=False` decodes without
    drafts (same tokens). `mcp` / `mcp_hosts` / `handoff`: `/v1/responses`' MCP tools, the
    confidence hand-off (`extras.py`). With `api_keys`, every `/v1/*` route needs one of
    them (`server/auth.py`). `/metrics`, `x-request-id` (`server/observe.py`) and the
    playground at `/` are always on.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    engine = Engine(model, model_name=model_name, needle_factory=needle_factory,
                    speculate=speculate)
    workers = workers or (DEFAULT_SESSIONS if batching else default_workers())
    scheduler = None
    admission = None  # the app's one admission: the scheduler's with batching (api/admission.py)
    if batching:
        from ..api.scheduler import DEFAULT_STEP_TOKENS, Scheduler

        scheduler = Scheduler(engine.model, max_sessions=workers, max_kv_bytes=max_kv_bytes,
                              max_queue=max_queue, step_tokens=step_tokens or DEFAULT_STEP_TOKENS)
        engine.scheduler = scheduler
        admission = scheduler.admission
    pool = WorkerPool(workers, max_queue, admission=admission)
    metrics = Metrics(pool, scheduler)  # this app's own registry
    if stage_health(engine.model) is not None:  # stage losses, replays
        metrics.registry.register(StageCollector(engine.model))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        pool.shutdown()  # queued work is dropped; running turns end on their own (bounded)
        if scheduler is not None:
            scheduler.close()  # running turns fail at their next step

    app = FastAPI(
        title="needlepoint", version=_version(), docs_url=None, redoc_url=None, lifespan=lifespan
    )
    app.state.engine = engine
    app.state.pool = pool
    app.state.metrics = metrics
    api_keys = tuple(api_keys)
    install_openapi(app, served=engine.name, api_keys=bool(api_keys))  # as the server behaves
    _install_error_handlers(app)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(ApiKeyMiddleware, checker=KeyChecker(api_keys))
    app.add_middleware(BodyLimitMiddleware, limit=max_body_bytes, timeout=body_timeout_s)
    app.add_middleware(ObserveMiddleware, metrics=metrics)  # outermost: ids, log, counts
    install_metrics(app, metrics)
    install_playground(app)
    install_extras(app, as_api_error, mcp=mcp, mcp_hosts=mcp_hosts, handoff=handoff)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        batch = {"scheduler": scheduler.stats()} if scheduler is not None else {}
        stages = stage_health(engine.model)  # a staged model: "degraded" while recovering
        return {"status": stages["status"] if stages else "ok", "model": engine.name,
                **pool.stats(), "batching": scheduler is not None, **batch,
                **({"stages": stages} if stages else {})}

    @app.get("/v1/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return ModelList(data=[engine.card()])

    @app.get("/v1/models/{model_id}", response_model=ModelCard)
    async def get_model(model_id: str) -> ModelCard:
        engine.check_model(model_id)
        return engine.card()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        engine.check_model(req.model)
        job = engine.chat_job(req)  # message mapping and cheap checks; no model work yet
        ticket = pool.admit()
        if not req.stream:
            try:
                result = await pool.run(ticket, metrics.chat_run(job), cancel=job.cancel,
                                        gone=_disconnected(request))
            except ClientGone:
                return Response(status_code=499)  # nobody is listening any more
            return JSONResponse(job.completion(result).model_dump(),
                                headers=handoff_headers(result.envelope))
        pump = pool.stream(ticket, metrics.chat_stream(job), job.cancel)
        # Wait for the first item before committing to a 200: errors found while preparing
        # (bad tool schema, prompt over the context) still become proper 4xx responses.
        try:
            first = await pump.next()
        except BaseException:
            pump.cancel()
            raise
        usage = bool(req.stream_options and req.stream_options.include_usage)
        writer = ChunkWriter(job, include_usage=usage)
        return StreamingResponse(
            _sse(writer, pump, first),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/needlepoint/complete")
    async def native_complete(req: NativeCompleteRequest, request: Request) -> Response:
        if req.model is not None:
            engine.check_model(req.model)
        job = engine.native_job(req)
        ticket = pool.admit()
        try:
            envelope = await pool.run(ticket, metrics.native_run(job), cancel=job.cancel,
                                      gone=_disconnected(request))
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse(envelope)

    return app


async def _disconnected(request: Request) -> None:
    """Ends when the client disconnects (the body has been read: the next ASGI message is
    the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(
    writer: ChunkWriter, pump: EventPump[Delta | ChatResult], first: tuple[bool, Any]
) -> AsyncIterator[str]:
    """Server-sent events, one per decoded piece; the pump is cancelled if the client leaves."""
    try:
        yield _event(writer.start())
        more, item = first
        while more:
            for chunk in writer.feed(item):
                yield _event(chunk)
            more, item = await pump.next()
        for chunk in writer.finish():
            yield _event(chunk)
        yield "data: [DONE]\n\n"
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        yield _event(as_api_error(exc).body())
    finally:
        pump.cancel()


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


# ---------------------------------------------------------------------------------------------
# Errors: everything a client can cause is a 4xx with an OpenAI-style error object
# ---------------------------------------------------------------------------------------------
def _validation_error(exc: RequestValidationError, content_type: str = "") -> ApiError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    media = content_type.split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        return bad_request(f"Content-Type must be application/json, got {media!r}: the "
                           "body is read as JSON", code="invalid_content_type")
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "invalid JSON")
        return bad_request(f"Request body is not valid JSON: {detail}", code="invalid_json")
    if not [p for p in first.get("loc", ()) if p != "body"]:
        return bad_request("The request body must be a JSON object (the chat-completion "
                           "request)", code="invalid_body")
    message, param = validation_message(first)
    # A union field reports one error per alternative: count other fields only.
    others = {validation_message(e)[1] for e in errors[1:]} - {param}
    more = f" (and {len(others)} more invalid fields)" if others else ""
    return bad_request(f"{message}{more}", param=param)


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        return as_api_error(exc).response()

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation_error(exc, request.headers.get("content-type", "")).response()

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        # Starlette's headers kept: a 405 carries `Allow`.
        return ApiError(exc.status_code, str(exc.detail), type=kind,
                        headers=exc.headers).response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(NeedlepointError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    # No handler for `Exception`: Starlette would answer it and then re-raise, and uvicorn
    # resets the connection. `CatchAllMiddleware` answers it instead.


def _version() -> str:
    from ..version import __version__

    return __version__
