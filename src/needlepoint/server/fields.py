"""The request-field policy: each OpenAI chat-completions field is honoured, accepted only at a
neutral value, or refused with a 400 that names it (`param`) and says what is allowed.

Honoured: model, messages, tools, tool_choice (incl. `allowed_tools`), parallel_tool_calls,
max_tokens / max_completion_tokens, stream, stream_options.include_usage, n (1), temperature,
top_p, top_k (ours), seed, call_threshold (ours: decline a weak call), stop, logprobs,
top_logprobs, response_format, reasoning_effort (a reasoning budget), chat_template_kwargs
(variables for a template model's chat template, e.g. Qwen3's enable_thinking, as vLLM and
llama.cpp take them), and the caller's identifiers user / safety_identifier /
prompt_cache_key (logged at debug level only: by OpenAI's definition they do not change the
answer). Neutral values only: presence_penalty and frequency_penalty 0,
logit_bias {}, store false, metadata {}, service_tier "auto"/"default", modalities ["text"],
stream_options.include_obfuscation false. Refused whenever set: the legacy `functions` /
`function_call` (use `tools` / `tool_choice`), audio, prediction, web_search_options,
verbosity, moderation, prompt_cache_options, prompt_cache_retention; legacy "function"
messages, message `function_call` / `refusal` / `audio`, and `name` outside tool messages.
"""

from __future__ import annotations

import logging
from typing import Any

from .errors import ApiError, bad_request
from .schemas import MAX_TOKENS_CEILING, ChatCompletionRequest

log = logging.getLogger("needlepoint.server")

# Reasoning budget (free-phase tokens before the call is forced) per reasoning_effort.
REASONING_BUDGETS: dict[str, int] = {"none": 0, "minimal": 0, "low": 64, "medium": 256,
                                     "high": 512, "xhigh": 1024, "max": 2048}

TOOL_CHOICE = ('"none", "auto", "required", {"type": "function", "function": {"name": ...}} '
               'or {"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", '
               '"tools": [...]}}')
# What each field allows, for error messages (keyed by the field's name in the request).
RULES: dict[str, str] = {
    "model": "the served model's id, a string (see GET /v1/models)",
    "messages": "a non-empty list of messages, each {role, content}",
    "role": "one of system, developer, user, assistant, tool",
    "content": "a string, or a list of {\"type\": \"text\", \"text\": ...} parts",
    "tools": 'a list of {"type": "function", "function": {"name", "description", '
             '"parameters"}}',
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": "true or false",
    "max_tokens": f"an integer between 1 and {MAX_TOKENS_CEILING}",
    "max_completion_tokens": f"an integer between 1 and {MAX_TOKENS_CEILING}",
    "stream": "true or false",
    "stream_options": '{"include_usage": true | false}',
    "n": "1 (one choice per request)",
    "temperature": "a number between 0 and 2",
    "top_p": "a number greater than 0 and at most 1",
    "top_k": "an integer >= 0 (0: no limit)",
    "seed": "an integer in [-2**63, 2**63)",
    "call_threshold": "a probability between 0 and 1 (a call the model gives less is "
                      "declined: the answer is text), or null for the default",
    "stop": "a string or a list of up to 4 non-empty strings",
    "logprobs": "true or false",
    "top_logprobs": "an integer between 0 and 20, with logprobs: true",
    "response_format": '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                       '"json_schema": {"name": ..., "schema": {...}}}',
    "reasoning_effort": ", ".join(REASONING_BUDGETS),
    "chat_template_kwargs": "an object of chat-template variables (e.g. "
                            '{"enable_thinking": false}), for a chat-template model',
    "presence_penalty": "0 (penalties are not supported)",
    "frequency_penalty": "0 (penalties are not supported)",
    "logit_bias": "{} (logit bias is not supported)",
    "store": "false (completions are not stored)",
    "metadata": "{} (metadata belongs to stored completions, which are not supported)",
    "service_tier": '"auto" or "default"',
    "modalities": '["text"]',
    "text": "a non-empty string",
}
REFUSED = {
    "functions": "the legacy 'functions' field is not supported: send 'tools' instead",
    "function_call": "the legacy 'function_call' field is not supported: send 'tool_choice'",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "verbosity": "'verbosity' is not supported",
    "moderation": "moderation is not supported",
    "prompt_cache_options": "prompt caching options are not supported",
    "prompt_cache_retention": "prompt cache retention is not supported",
}


def _refuse(param: str, message: str) -> ApiError:
    return bad_request(f"Unsupported value for '{param}': {message}.", param=param,
                       code="unsupported_parameter")


def check_fields(req: ChatCompletionRequest) -> None:
    """Raise the 400 for the first field this server cannot honour."""
    for name, message in REFUSED.items():
        if getattr(req, name) is not None:
            raise _refuse(name, message)
    neutral = {
        "presence_penalty": not req.presence_penalty,
        "frequency_penalty": not req.frequency_penalty,
        "logit_bias": not req.logit_bias,
        "store": not req.store,
        "metadata": not req.metadata,
        "service_tier": req.service_tier in (None, "auto", "default"),
        "modalities": req.modalities in (None, ["text"]),
    }
    for name, ok in neutral.items():
        if not ok:
            raise _refuse(name, f"only {RULES[name]} is accepted")
    if req.stream_options is not None:
        if not req.stream:
            raise _refuse("stream_options", "it is only allowed with stream: true")
        if req.stream_options.include_obfuscation:
            raise _refuse("stream_options.include_obfuscation", "the stream is never "
                          "obfuscated; only false is accepted")
    if req.top_logprobs is not None and not req.logprobs:
        raise _refuse("top_logprobs", "it needs logprobs: true")
    if req.max_tokens is not None and req.max_completion_tokens is not None and \
            req.max_tokens != req.max_completion_tokens:
        raise bad_request("max_tokens and max_completion_tokens disagree: send one",
                          param="max_completion_tokens")
    if isinstance(req.tool_choice, dict):  # no declared shape matched
        raise bad_request(f"Invalid 'tool_choice': got {_shown(req.tool_choice)}; expected "
                          f"{TOOL_CHOICE}.", param="tool_choice")
    for k, tool in enumerate(req.tools or []):
        if tool.type != "function" or tool.function is None:
            raise _refuse(f"tools.{k}", f"only function tools are supported, got type "
                          f"{tool.type!r}")
    for k, message in enumerate(req.messages):
        _check_message(k, message)
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema" and (
            fmt.json_schema is None or fmt.json_schema.schema_ is None):
        raise bad_request('Invalid \'response_format\': json_schema needs {"json_schema": '
                          '{"name": ..., "schema": {...}}}.', param="response_format")
    ids = {k: getattr(req, k) for k in ("user", "safety_identifier", "prompt_cache_key")}
    if any(ids.values()):
        log.debug("request identifiers: %s", {k: v for k, v in ids.items() if v})


def _check_message(k: int, message: Any) -> None:
    where = f"messages.{k}"
    if message.role == "function":
        raise _refuse(f"{where}.role", "legacy 'function' messages are not supported: answer "
                      "a tool call with a 'tool' message")
    for name in ("function_call", "refusal", "audio"):
        if getattr(message, name) is not None:
            raise _refuse(f"{where}.{name}", f"'{name}' in messages is not supported")
    if message.name is not None and message.role != "tool":
        raise _refuse(f"{where}.name", "participant names are not supported")


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validation_message(error: dict[str, Any]) -> tuple[str, str | None]:
    """(message, param) for one pydantic error of a request body: the field's path without
    pydantic's union-member tags, what was sent, and what the field allows."""
    parts = [p for p in error.get("loc", ()) if p != "body"]
    path = [str(p) for p in parts if isinstance(p, int) or _is_field(p)]
    param = ".".join(path) or None
    leaf = next((p for p in reversed(path) if not p.isdigit()), None)
    if error.get("type") == "extra_forbidden":
        return (f"Unsupported field '{param}': this server does not implement it, so it is "
                "refused rather than ignored.", param)
    rule = RULES.get(leaf or "") or RULES.get(path[0] if path else "")
    if error.get("type") == "missing":
        return f"Missing required field '{param}'" + (f": {rule}." if rule else "."), param
    got = f"got {_shown(error['input'])}" if "input" in error else "invalid value"
    expected = rule or error.get("msg", "a valid value")
    return f"Invalid '{param}': {got}; expected {expected}.", param


def _is_field(part: Any) -> bool:
    """A field name, not a union tag ('str', 'literal[...]', 'NamedToolChoice', ...)."""
    return (isinstance(part, str) and part.isidentifier() and not part[0].isupper()
            and part not in ("str", "int", "float", "bool", "list", "dict", "none"))
