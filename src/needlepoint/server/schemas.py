"""Pydantic models of the wire: the OpenAI chat-completions subset we serve, and the native API.

Request models validate *shape and range* only (a negative `max_tokens`, a `temperature` of 7,
a message without a role): pydantic rejects those before any model work, and the app turns
the rejection into an OpenAI-style 400. Semantic checks that need the model (context length,
tool JSON schemas) happen later, in `engine.py`.

Unknown request fields are ignored rather than rejected: the official clients send fields we
have no use for (`user`, `metadata`, `store`, ...) and refusing them would break those clients.
Fields that would change the answer if we ignored them (`n > 1`, `logprobs`) are rejected.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Upper bound that no context window reaches: keeps "absurd" values (2**63) from ever
# reaching the generator; the real per-model bound is checked against the context length.
MAX_TOKENS_CEILING = 1 << 20


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------
class FunctionCallIn(_Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text; OpenAI allows a list of parts, of which we can use text parts."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError(f"unsupported content part type {part.type!r}: text only")
            parts.append(part.text)
        return "".join(parts)


class ToolFunction(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Lenient):
    type: Literal["function"] = "function"
    function: ToolFunction


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Lenient):
    include_usage: bool = False


class SamplingOptions(_Lenient):
    """Generation options shared by both endpoints (OpenAI ranges; `top_k` is our extension)."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)


class ChatCompletionRequest(SamplingOptions):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_CEILING)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_CEILING)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1, le=1)  # one choice per request: no batching
    # Options that would change the answer if ignored: only their neutral values pass.
    logprobs: Literal[False] | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise ValueError("max_tokens and max_completion_tokens disagree: send one")
        for name in ("stop", "presence_penalty", "frequency_penalty", "logit_bias"):
            if getattr(self, name):
                raise ValueError(f"'{name}' is not supported by this server")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class NativeCompleteRequest(SamplingOptions):
    """`POST /v1/needlepoint/complete`: the `Needle(...).complete(text)` call over HTTP."""

    model: str | None = None  # optional: the server serves one model
    text: str
    tools: list[dict[str, Any]] = Field(default_factory=list)
    system: str | None = None
    max_new_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_CEILING)


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------
class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    # Not in OpenAI's schema; the name DeepSeek and vLLM use, which clients pass through.
    reasoning_content: str | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "needlepoint"
    context_length: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ChunkFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChunkFunction


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
