"""`/openapi.json` as the server behaves, not as FastAPI guesses.

FastAPI's generated document lists a 422 (this server never sends one: validation errors
are 400s in OpenAI's error shape, `errors.py`), leaves out the statuses the server does send
(400, 404, 413, 429, 500, 503, and 401 when API keys are required), gives both chat
endpoints' 200 responses an empty schema, and does not say that `stream: true` answers with
`text/event-stream`. `install_openapi(app)` replaces `app.openapi` with a builder that
starts from FastAPI's document and states each of these; `tests/server/test_server_openapi.py`
runs schemathesis against it (no 5xx, every response as documented).

Every error response is `ErrorResponse` (`{"error": {"message", "type", "param", "code"}}`).
A method a path does not serve is a 405 with an `Allow` header (not an operation, so it is
not in the document; the app's handler keeps Starlette's header).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from .fields import REFUSED
from .responses_openapi import describe_extras
from .schemas import ChatCompletion, ChatCompletionChunk, ErrorResponse, ModelCard, ModelList

REF = "#/components/schemas/{model}"
CHAT = "/v1/chat/completions"
NATIVE = "/v1/needlepoint/complete"
MODEL = "/v1/models/{model_id}"

ERRORS: dict[str, str] = {
    "400": "Bad request: invalid JSON, a field out of range or refused by name, a bad tool "
           "schema (`invalid_tool`), a prompt over the context (`context_length_exceeded`).",
    "401": "Missing or wrong API key (`Authorization: Bearer KEY`).",
    "404": "The model named in the request is not the one this server serves.",
    "413": "The request body is over the server's `--max-body-bytes`.",
    "429": "Busy: the queue, the live sessions or the KV-cache memory are full; retry after "
           "`Retry-After` seconds.",
    "408": "The client sent the headers but not the whole body in time.",
    "500": "The model failed (non-finite activations: corrupt weights).",
    "503": "A stage of a model cut into stages is unavailable; retry later.",
    "502": "An MCP server failed, died or did not answer in time (the message names it).",
}

ENVELOPE: dict[str, Any] = {
    "title": "Envelope",
    "description": "The native `Needle.complete` envelope (docs/api.md).",
    "type": "object",
    "required": ["type", "function_calls", "text", "reasoning", "confidence", "timings"],
    "properties": {
        "type": {"type": "string", "enum": ["call", "refuse", "respond", "invalid"]},
        "function_calls": {"type": "array", "items": {
            "type": "object", "required": ["name", "arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}}}},
        "text": {"type": "string"},
        "reasoning": {"type": "string"},
        "confidence": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                       "description": "The answer's confidence, for every model: the "
                       "confidence head's where the archive has one, else the product over "
                       "the decisions the model made of the chosen alternative's probability "
                       "among the grammar-allowed tokens (docs/api.md, 'The decision "
                       "confidence'). Null for an answer from the hand-off model (its "
                       "`handoff.confidence` is the local one) or when the model decided "
                       "nothing (no tools)."},
        "call_confidences": {"type": "array", "items": {"type": ["number", "null"]},
                             "description": "One confidence per call, in the order of "
                             "`function_calls`."},
        "decisions": {"type": "array", "items": {
            "type": "object", "properties": {
                "kind": {"type": "string", "enum": ["route", "call", "between"]},
                "call": {"type": ["integer", "null"]}, "prob": {"type": "number"},
                "tokens": {"type": "integer"}}},
            "description": "The evidence of `confidence`: each decision's probability."},
        "confidence_source": {"type": ["string", "null"], "enum": ["head", "tokens", None],
                              "description": "Which measure `confidence` is: the confidence "
                              "head's (`head`) or the model's decisions' (`tokens`)."},
        "timings": {"type": "object", "additionalProperties": {"type": "number"}},
        "stop_reason": {"type": "string"},
        "seed": {"type": "integer"},
        "error": {"type": "string"},
        "note": {"type": "string"},
    },
    "additionalProperties": True,
}

HEALTH: dict[str, Any] = {
    "title": "Health", "type": "object", "required": ["status", "model"],
    "properties": {"status": {"type": "string", "enum": ["ok"]}, "model": {"type": "string"},
                   "batching": {"type": "boolean"}},
    "additionalProperties": True,
}

# One server-sent event (`schema` of an event-stream media type describes each event, as
# OpenAPI before 3.2 reads it): `data` is a ChatCompletionChunk as JSON (or, after an error
# once the stream has started, an ErrorResponse), and the last event is `[DONE]`.
SSE: dict[str, Any] = {
    "schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json", "contentSchema": {
                "anyOf": [{"$ref": "#/components/schemas/ChatCompletionChunk"},
                          {"$ref": "#/components/schemas/ErrorResponse"}]}}]}},
        "description": "Server-sent events: `data: {ChatCompletionChunk}` per decoded piece, "
                       "then `data: [DONE]`.",
    },
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(model=name)}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _add_models(components: dict[str, Any], *models: type[BaseModel]) -> None:
    for model in models:
        schema = model.model_json_schema(ref_template=REF, mode="serialization")
        for name, sub in schema.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components[model.__name__] = schema


def _errors(*statuses: str) -> dict[str, Any]:
    return {s: {"description": ERRORS[s], "content": _json(_ref("ErrorResponse"))}
            for s in statuses}


def _served_only(schema: dict[str, Any], served: str) -> None:
    """`model` (request bodies, the path parameter) can only be the served model's name:
    any other is a 404, so the document says so (a generated request then reaches the model
    rather than stopping at the name)."""
    components = schema["components"]["schemas"]
    name = {"type": "string", "enum": [served]}
    for request, required in (("ChatCompletionRequest", True), ("NativeCompleteRequest", False)):
        properties = components.get(request, {}).get("properties", {})
        if "model" in properties:
            properties["model"] = name if required else {"anyOf": [name, {"type": "null"}]}
    for parameter in schema["paths"].get(MODEL, {}).get("get", {}).get("parameters", []):
        if parameter.get("name") == "model_id":
            parameter["schema"] = dict(name)


ALARM_TOOL = {"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm at a time of day.",
    "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                   "required": ["time"]}}}


def _examples(schema: dict[str, Any], served: str) -> None:
    """Request examples for both chat endpoints (a tool call, streamed and not; a JSON
    answer): clients see a working body, and schemathesis sends them first."""
    query = [{"role": "user", "content": "wake me up at 06:45"}]
    chat = {
        "call": {"model": served, "messages": query, "tools": [ALARM_TOOL]},
        "stream": {"model": served, "messages": query, "tools": [ALARM_TOOL], "stream": True,
                   "stream_options": {"include_usage": True}},
        "json": {"model": served, "messages": query, "max_tokens": 40, "response_format": {
            "type": "json_schema", "json_schema": {"name": "alarm", "schema": {
                "type": "object", "properties": {"time": {"type": "string"}}}}}},
    }
    native = {"call": {"text": "wake me up at 06:45", "tools": [ALARM_TOOL["function"]]}}
    for path, examples in ((CHAT, chat), (NATIVE, native)):
        body = schema["paths"].get(path, {}).get("post", {}).get("requestBody", {})
        content = body.get("content", {}).get("application/json")
        if content is not None:
            content["examples"] = {name: {"value": value} for name, value in examples.items()}


def _refused_as_null(components: dict[str, Any]) -> None:
    """Fields the server refuses whenever they are set (`fields.REFUSED`, and a message's
    `function_call`/`refusal`/`audio`) are documented as null only, with the reason."""
    fields = [("ChatCompletionRequest", key, why) for key, why in REFUSED.items()]
    fields += [("ChatMessage", key, f"a message's {key!r} is not supported")
               for key in ("function_call", "refusal", "audio")]
    for model, key, why in fields:
        properties = components.get(model, {}).get("properties", {})
        if key in properties:
            properties[key] = {"type": "null", "description": f"Refused unless null: {why}."}


def describe(schema: dict[str, Any], *, api_keys: bool = False,
             served: str | None = None) -> dict[str, Any]:
    """Patch FastAPI's document `schema` in place (and return it) to match the server;
    `served`: the one model name the server answers to."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    _add_models(components, ErrorResponse, ChatCompletion, ChatCompletionChunk, ModelCard,
                ModelList)
    components["Envelope"] = ENVELOPE
    components["Health"] = HEALTH
    auth = ("401",) if api_keys else ()
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            statuses: tuple[str, ...] = ()
            if path.startswith("/v1/"):
                statuses += auth
            if method == "post":
                statuses += ("400", "408", "413", "429", "500", "503")
            if path in (CHAT, NATIVE, MODEL):
                statuses += ("404",)
            responses.update(_errors(*sorted(set(statuses))))
            if path == CHAT:
                responses["200"] = {
                    "description": "The completion; with `stream: true`, server-sent events.",
                    "content": {**_json(_ref("ChatCompletion")), "text/event-stream": SSE}}
            elif path == NATIVE:
                responses["200"] = {"description": "The turn's envelope.",
                                    "content": _json(_ref("Envelope"))}
            elif path == "/health":
                responses["200"] = {"description": "The server is up.",
                                    "content": _json(_ref("Health"))}
    _refused_as_null(components)
    describe_extras(schema, served, _errors)  # /v1/responses, the MCP routes
    if served is not None:
        _served_only(schema, served)
        _examples(schema, served)
    return schema


def install_openapi(app: FastAPI, *, served: str | None = None, api_keys: bool = False
                    ) -> None:
    """Serve `describe`'s document at `/openapi.json` (built once, on the first request).
    `served`: the model name; `api_keys`: the `/v1/*` routes require a key (401 too)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                   description=app.description)
            app.openapi_schema = describe(document, api_keys=api_keys, served=served)
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]
