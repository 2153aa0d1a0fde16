"""`/openapi.json` for the Responses and MCP routes (`/v1/responses`, the MCP routes): their 200
bodies, event stream, statuses and the served model name, added to `openapi.describe`'s
document (which stays the one place that builds it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RESPONSES = "/v1/responses"
MCP_TOOLS = "/v1/needlepoint/mcp/tools"
MCP_CALL = "/v1/needlepoint/mcp/call"

RESPONSE: dict[str, Any] = {
    "title": "Response",
    "description": "A Responses API `response` object (docs/server.md).",
    "type": "object", "required": ["id", "object", "status", "model", "output"],
    "properties": {
        "id": {"type": "string"}, "object": {"type": "string", "enum": ["response"]},
        "status": {"type": "string", "enum": ["completed", "incomplete", "in_progress"]},
        "model": {"type": "string"}, "created_at": {"type": "integer"},
        "output": {"type": "array", "items": {"type": "object", "required": ["type"],
                                              "additionalProperties": True}},
        "usage": {"type": ["object", "null"]},
    },
    "additionalProperties": True,
}

RESPONSE_EVENTS: dict[str, Any] = {
    "schema": {
        "type": "object", "required": ["data"],
        "properties": {"event": {"type": "string"},
                       "data": {"type": "string", "contentMediaType": "application/json"}},
        "description": "Server-sent events, each `event: TYPE` and `data: {...}`: "
                       "response.created, response.in_progress, response.output_item.added, "
                       "response.content_part.added, response.output_text.delta / .done, "
                       "response.function_call_arguments.delta / .done, "
                       "response.output_item.done, response.completed (or an `error`).",
    },
}

EXAMPLE = {"model": None, "input": "wake me up at 06:45", "tools": [
    {"type": "function", "name": "set_alarm", "description": "Set an alarm at a time of day.",
     "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                    "required": ["time"]}}]}


def describe_extras(schema: dict[str, Any], served: str | None,
                    errors: Callable[..., dict[str, Any]]) -> None:
    """Patch the document in place; `errors(*statuses)` gives the error responses."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Response"] = RESPONSE
    paths = schema.get("paths", {})
    post = paths.get(RESPONSES, {}).get("post")
    if post is not None:
        post["responses"].update(errors("404"))
        post["responses"]["200"] = {
            "description": "The response; with `stream: true`, server-sent events.",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/"
                                                                 "Response"}},
                        "text/event-stream": RESPONSE_EVENTS}}
        if served is not None:
            content = post.get("requestBody", {}).get("content", {}).get("application/json")
            if content is not None:
                content["examples"] = {"call": {"value": {**EXAMPLE, "model": served}}}
    call = paths.get(MCP_CALL, {}).get("post")
    if call is not None:
        call["responses"].update(errors("404", "502"))
    if served is not None:
        properties = components.get("ResponsesRequest", {}).get("properties", {})
        if "model" in properties:
            properties["model"] = {"type": "string", "enum": [served]}
