"""OpenAI-style error objects: every rejection the server makes has the same shape.

`{"error": {"message", "type", "param", "code"}}` with the HTTP status the official client maps
to its exception classes (400 BadRequestError, 404 NotFoundError, 413/422 APIStatusError,
429 RateLimitError).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse

from ..api.admission import AdmissionClosed, AdmissionFull
from ..api.lease import SchedulerClosed
from ..errors import (
    ContextLengthError,
    InvalidOptionError,
    InvalidQueryError,
    ModelInputError,
    NeedlepointError,
    NonFiniteActivationError,
    StageError,
    ToolSchemaError,
)
from ..generation.content import ContentSchemaError
from .schemas import ErrorBody, ErrorResponse

log = logging.getLogger("needlepoint.server")


class ApiError(Exception):
    """An error the server answers on purpose (never a 500)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        err = ErrorBody(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=err).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(name: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"The model {name!r} does not exist; this server serves {served!r}.",
        param="model",
        code="model_not_found",
    )


def overloaded(detail: str) -> ApiError:
    """429: the admission (`api/admission.py`) refused the request; `detail` says which cap
    (the queue, the live sessions, the KV bytes) was reached."""
    # `Retry-After` lets the official client's retry loop back off sensibly.
    return ApiError(
        429,
        f"Server busy: {detail}. Retry later.",
        type="rate_limit_error",
        code="server_overloaded",
        headers={"Retry-After": "1"},
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"Request body exceeds the server's limit of {limit} bytes.",
        code="request_too_large",
    )


def body_timeout(seconds: float) -> ApiError:
    """408: the body did not arrive in time; the connection is closed after the answer."""
    return ApiError(
        408,
        f"The request body was not received within {seconds:g} seconds.",
        code="request_timeout",
        headers={"Connection": "close"},
    )


def context_exceeded(context: int, prompt: int, requested: int | None) -> ApiError:
    if requested is None:
        message = (
            f"This model's maximum context length is {context} tokens, but the messages "
            f"and tools take {prompt} tokens. Shorten them; the server does not truncate."
        )
        param = "messages"
    else:
        message = (
            f"This model's maximum context length is {context} tokens. However, you "
            f"requested {prompt + requested} tokens ({prompt} in the messages and tools, "
            f"{requested} in the completion). Reduce the length of the messages or the "
            "completion."
        )
        param = "max_tokens"
    return ApiError(400, message, param=param, code="context_length_exceeded")


def as_api_error(exc: BaseException) -> ApiError:
    """What a client gets for `exc`: its own 4xx for what it can cause, 500 / 503 (logged)
    for the server's model or a bug."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, AdmissionFull):  # the one admission (`api/admission.py`) refused it
        return overloaded(detail=str(exc))
    if isinstance(exc, AdmissionClosed | SchedulerClosed):
        return ApiError(503, "The server is shutting down. Retry later.", type="server_error",
                        code="shutting_down")
    if isinstance(exc, ToolSchemaError):
        return bad_request(f"Invalid tool schema: {exc}", param="tools", code="invalid_tool")
    if isinstance(exc, ContextLengthError):
        return context_exceeded(exc.limit, exc.prompt_tokens, exc.max_new_tokens)
    if isinstance(exc, ModelInputError):
        return bad_request(str(exc), param="messages", code="invalid_model_input")
    if isinstance(exc, ContentSchemaError):
        return bad_request(f"Invalid 'response_format': {exc}", param="response_format",
                           code="invalid_response_format")
    if isinstance(exc, InvalidQueryError):
        return bad_request(str(exc), param="messages", code="empty_query")
    if isinstance(exc, InvalidOptionError):
        return bad_request(str(exc), code="invalid_option")
    if isinstance(exc, NonFiniteActivationError):  # the server's model is broken, not the request
        log.error("model failure: %s", exc)
        return ApiError(500, f"The model failed: {exc}", type="server_error",
                        code="model_error")
    if isinstance(exc, StageError):  # a stage of the server's own model failed: retry later
        log.error("stage failure: %s", exc)
        return ApiError(503, f"A model stage is unavailable: {exc}", type="server_error",
                        code="stage_unavailable")
    if isinstance(exc, NeedlepointError):
        return bad_request(str(exc))
    log.exception("unhandled error while serving a request", exc_info=exc)
    return ApiError(500, "Internal server error.", type="server_error", code="internal_error")
