"""A Responses API request as chat messages and chat-completion fields.

The Responses route runs on the chat-completions job (`engine.py`), so a response is decoded
by the same engine, scheduler and grammar. The mapping:

* `instructions` -> a system message (not carried over by `previous_response_id`, as OpenAI
  documents); the stored conversation of `previous_response_id` comes next.
* `input` as a string -> one user message; as items: `message` items (or `{role, content}`
  with `input_text` / `output_text` parts) keep their role, consecutive `function_call` items
  become one assistant message with `tool_calls`, `function_call_output` items become `tool`
  messages (`call_id` -> `tool_call_id`); `reasoning` items are dropped (the model never sees
  its earlier reasoning); `mcp_approval_response` items are read by `responses_mcp.py`.
* `function` tools -> chat tools; `mcp` tools are expanded by `responses_mcp.py`.
* `tool_choice` (`auto` / `none` / `required`, `{"type": "function", "name"}`,
  `{"type": "allowed_tools", ...}`), `parallel_tool_calls`, `max_output_tokens`,
  `temperature`, `top_p`, `text.format` (`text`, `json_object`, `json_schema`) -> their
  chat-completion fields.
"""

from __future__ import annotations

from typing import Any

from .errors import bad_request
from .responses_schemas import ResponsesRequest

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
SKIPPED_ITEMS = ("reasoning", "mcp_list_tools", "mcp_approval_request",
                 "mcp_approval_response", "item_reference")


def check_refused(req: ResponsesRequest) -> None:
    """The fields this server cannot honour, refused by name."""
    if req.background:
        raise bad_request("background responses are not supported: omit 'background'",
                          param="background", code="unsupported_parameter")
    for name in ("conversation", "prompt"):
        if getattr(req, name) is not None:
            raise bad_request(f"'{name}' is not supported: this server keeps no stored "
                              f"{name}s (send 'input', or use 'previous_response_id')",
                              param=name, code="unsupported_parameter")


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own `input` as chat messages."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}] if req.input else []
    messages: list[dict[str, Any]] = []
    for k, item in enumerate(req.input):
        kind = item.get("type", "message" if "role" in item else None)
        where = f"input[{k}]"
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            if messages and messages[-1]["role"] == "assistant" and \
                    messages[-1].get("tool_calls") and messages[-1].get("content") is None:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
            if not isinstance(output, str):
                raise bad_request(f"Invalid '{where}.output': expected a string.",
                                  param=f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": output})
        elif kind == "mcp_call":
            messages.extend(mcp_call_messages(item, where))
        elif kind in SKIPPED_ITEMS:
            continue
        else:
            raise bad_request(f"Invalid '{where}.type': {kind!r} input items are not "
                              "supported (message, function_call, function_call_output, "
                              "reasoning, mcp_call, mcp_approval_response).",
                              param=f"{where}.type", code="unsupported_input_item")
    return messages


def mcp_call_messages(item: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """An executed `mcp_call` item as the call and its result (the model saw both)."""
    call_id = str(item.get("id") or where)
    result = item.get("output") if item.get("error") is None else \
        f"error: {item.get('error')}"
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": _string(item, "name", where),
                      "arguments": str(item.get("arguments") or "{}")}}]},
        {"role": "tool", "tool_call_id": call_id, "content": str(result or "")}]


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad_request(f"Invalid '{where}.role': expected user, assistant, system or "
                          f"developer, got {role!r}.", param=f"{where}.role")
    content = item.get("content", "")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"Invalid '{where}.content[{j}]': {kind!r} parts are not "
                                  "supported (text only).", param=f"{where}.content[{j}]",
                                  code="unsupported_content")
            texts.append(str(part.get("text") or part.get("refusal") or ""))
        content = "".join(texts)
    if not isinstance(content, str):
        raise bad_request(f"Invalid '{where}.content': expected a string or text parts.",
                          param=f"{where}.content")
    return {"role": role, "content": content}


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"Invalid '{where}.{key}': expected a string.", param=f"{where}.{key}")
    return value


def function_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's `function` tools as chat tools (other types are left to the caller)."""
    out = []
    for k, tool in enumerate(tools or []):
        if tool.get("type") != "function":
            continue
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise bad_request(f"Invalid 'tools[{k}]': unknown key(s) {sorted(unknown)}.",
                              param=f"tools[{k}]")
        function = {"name": _string(tool, "name", f"tools[{k}]")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def check_tool_types(tools: list[dict[str, Any]] | None) -> None:
    for k, tool in enumerate(tools or []):
        if tool.get("type") not in ("function", "mcp"):
            raise bad_request(f"Invalid 'tools[{k}].type': {tool.get('type')!r} tools are not "
                              "supported (function, mcp).", param=f"tools[{k}].type",
                              code="unsupported_tool")


def tool_choice(choice: Any) -> Any:
    """`tool_choice` in its chat-completions form."""
    if choice is None or isinstance(choice, str):
        return choice
    kind = choice.get("type")
    if kind == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind == "allowed_tools":
        tools = [{"type": "function", "function": {"name": t.get("name")}}
                 for t in choice.get("tools", []) if isinstance(t, dict)]
        return {"type": "allowed_tools",
                "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": tools}}
    raise bad_request(f"Invalid 'tool_choice': {choice!r} is not supported (auto, none, "
                      "required, a function, allowed_tools).", param="tool_choice")


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as the chat `response_format`."""
    fmt = (text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise bad_request("Invalid 'text.format': expected an object.", param="text.format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise bad_request(f"Invalid 'text.format.type': {fmt.get('type')!r} (text, json_object, "
                      "json_schema).", param="text.format.type")


def chat_fields(req: ResponsesRequest) -> dict[str, Any]:
    """The chat-completion fields of a Responses request (besides messages and tools)."""
    fields: dict[str, Any] = {"model": req.model}
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if getattr(req, name) is not None:
            fields[name] = getattr(req, name)
    if req.max_output_tokens is not None:
        fields["max_completion_tokens"] = req.max_output_tokens
    choice = tool_choice(req.tool_choice)
    if choice is not None:
        fields["tool_choice"] = choice
    fmt = response_format(req.text)
    if fmt is not None:
        fields["response_format"] = fmt
    return fields
