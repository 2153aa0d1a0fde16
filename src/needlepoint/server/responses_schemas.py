"""The request of `POST /v1/responses` (OpenAI's Responses API).

Shape and range only, as `schemas.py` does for chat completions: the items of `input`, the
tools and `text.format` are checked when they are translated (`responses.py`), with a 400
that names the field. Every top-level field OpenAI defines is declared; those that change
nothing here (`store`, `include`, `metadata`, `truncation`, `reasoning`, identifiers) are
accepted and ignored, the ones this server cannot honour (`background: true`, a stored
`conversation`, a `prompt` template) are refused by name, and an unknown field is a 400.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .schemas import MAX_TOKENS_CEILING, _Lenient


class ResponsesRequest(_Lenient):
    model: str
    input: str | list[dict[str, Any]] = Field(default="")
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_CEILING)
    max_tool_calls: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    text: dict[str, Any] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    previous_response_id: str | None = None
    # accepted and ignored: they change nothing in the answer
    store: bool | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    context_management: Any = None
    # refused unless null / false
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
