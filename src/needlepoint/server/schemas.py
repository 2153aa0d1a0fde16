"""Pydantic models of the wire: the OpenAI chat-completions subset we serve, and the native API.

Request models validate *shape and range* only (a negative `max_tokens`, a `temperature` of 7,
a message without a role): pydantic rejects those before any model work, and the app turns
the rejection into an OpenAI-style 400. Semantic checks that need the model (context length,
tool JSON schemas) happen later, in `engine.py`.

Every field of OpenAI's chat-completions request is declared here; none is silently ignored.
`fields.py` holds the policy: a field is honoured, or accepted only at its neutral value
(`n: 1`, `store: false`, a zero penalty), or refused with a 400 that names it. A field that is
not part of the API at all is refused the same way (`extra="forbid"`), so a typo never passes
as a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Upper bound that no context window reaches: keeps "absurd" values (2**63) from ever
# reaching the generator; the real per-model bound is checked against the context length.
MAX_TOKENS_CEILING = 1 << 20


class _Lenient(BaseModel):
    # The name stays for the request models' base; unknown keys are refused, not dropped.
    # Strict types: `"seed": true` or `"max_tokens": "5"` is a 400, as the published schema
    # (an integer) says, not silently read as 1 or 5 (only an int may stand for a float).
    model_config = ConfigDict(extra="forbid", strict=True)


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
    # Other part types (image_url, input_audio, file, ...) carry their own keys: kept, so
    # that `ChatMessage.text` refuses them by type, with one clear message.
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    # "function" is the legacy role: declared so that it gets a clear refusal (fields.py).
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None  # legacy: refused
    refusal: str | None = None  # an assistant's refusal text: refused
    audio: dict[str, Any] | None = None  # refused

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
            if part.model_extra:
                raise ValueError(f"unsupported key(s) {sorted(part.model_extra)} in a text "
                                 "content part")
            parts.append(part.text)
        return "".join(parts)


class ToolFunction(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # honoured by construction: the grammar always enforces


class ToolSpec(_Lenient):
    type: str = "function"  # only "function"; "custom" tools are refused (fields.py)
    function: ToolFunction | None = None
    custom: dict[str, Any] | None = None


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(_Lenient):
    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]


class AllowedToolChoice(_Lenient):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class StreamOptions(_Lenient):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # only false/absent: we never obfuscate


class JsonSchemaFormat(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # honoured by construction: the grammar always enforces


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingOptions(_Lenient):
    """Generation options shared by both endpoints (OpenAI ranges; `top_k` and
    `call_threshold` are our extensions).
    NaN and infinities are refused (`allow_inf_nan=False`)."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 63)  # int64, as OpenAI
    # ours: decline a call the model gives less probability than this (`generation/route.py`)
    call_threshold: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolChoice


class ChatCompletionRequest(SamplingOptions):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | dict[str, Any] | None = None  # other shapes: refused by name
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_CEILING)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_CEILING)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1, le=1)  # one choice per request: no batching
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stop: Annotated[str, Field(min_length=1)] | Annotated[
        list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh",
                              "max"] | None = None
    # variables for the model's chat template (Qwen3's enable_thinking), as vLLM and
    # llama.cpp's server take them
    chat_template_kwargs: dict[str, Any] | None = None
    # Accepted only at their neutral values (fields.py): the answer does not depend on them.
    presence_penalty: float | None = Field(default=None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    modalities: list[str] | None = None
    # Identifiers for the caller's own bookkeeping (logged at debug level, never used).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Features this server does not have: any value but null is refused by name.
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    verbosity: Any = None
    moderation: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None

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


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


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
    needlepoint: dict[str, Any] | None = None  # the extension object (server/stats.py)


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
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
