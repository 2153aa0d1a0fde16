"""OpenAI chat messages -> what a client asks (`ClientChat`): the chat (`api.chat.Chat`, the
library's one chat object: its messages in the chat formats' shape), the tools it offers,
forcing.

The server is stateless: every request carries the whole history, which is checked here and
kept as a `Chat`, the form `Needle` keeps its own chats in and renders (`Needle.chat_ids`)
and a hand-off endpoint is sent (`Chat.openai_messages`); there is no second copy. The
mapping:

* `system`/`developer` messages (anywhere) -> the system text, joined by newlines.
* user messages -> `{"role": "user", "content"}`; consecutive ones join (newline), and the
  first is the query (what tool retrieval sees); empty ones are refused by the library's query
  check (`api.needle.check_query`).
* an assistant message -> `{"role": "assistant", "content", "tool_calls"}`: its calls
  (`{"name", "arguments"}`, arguments parsed from their JSON text) or, without calls, its text.
* `tool` messages after an assistant message -> `{"role": "tool", "name", "content"}`, in the
  order the client sent them, each named after the call its `tool_call_id` answers, the
  content parsed as JSON when it is JSON.
* the conversation must end on a user or tool message: that is what the model answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..api.chat import Chat
from ..api.needle import check_query
from ..errors import InvalidQueryError
from .errors import bad_request
from .schemas import AllowedToolChoice, ChatMessage, NamedToolChoice, ToolSpec


@dataclass
class ClientChat:
    """One request's chat and what it offers: what the model is shown and must answer."""

    chat: Chat
    tools: list[dict[str, Any]] = field(default_factory=list)
    force: str | None = None  # None, "any" (a call is required) or the one required name


def _tools(
    specs: list[ToolSpec] | None, choice: str | NamedToolChoice | AllowedToolChoice | None
) -> tuple[list[dict[str, Any]], str | None]:
    tools = [spec.function.model_dump(exclude_none=True, exclude={"strict"})
             for spec in specs or [] if spec.function is not None]
    if choice is None or choice == "auto":
        return tools, None
    if choice == "none":
        return [], None  # offer no tools at all: the model can only answer in text
    if not tools:
        raise bad_request("tool_choice requires a non-empty 'tools' list", param="tool_choice")
    if choice == "required":
        return tools, "any"
    if isinstance(choice, AllowedToolChoice):
        return _allowed(tools, choice)
    assert isinstance(choice, NamedToolChoice)
    chosen = [tool for tool in tools if tool["name"] == choice.function.name]
    if not chosen:
        raise bad_request(
            f"tool_choice names {choice.function.name!r}, which is not in 'tools'",
            param="tool_choice",
        )
    # Only the chosen tool is shown, so the forced call cannot pick another one.
    return chosen, choice.function.name


def _allowed(tools: list[dict[str, Any]], choice: AllowedToolChoice
             ) -> tuple[list[dict[str, Any]], str | None]:
    """`allowed_tools`: only the listed tools are offered (in the `tools` order)."""
    names = []
    for k, entry in enumerate(choice.allowed_tools.tools):
        function = entry.get("function") if isinstance(entry, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if entry.get("type", "function") != "function" or not isinstance(name, str):
            raise bad_request(
                f"tool_choice.allowed_tools.tools.{k} must be "
                '{"type": "function", "function": {"name": ...}}',
                param=f"tool_choice.allowed_tools.tools.{k}")
        names.append(name)
    unknown = [n for n in names if n not in {t["name"] for t in tools}]
    if unknown:
        raise bad_request(f"tool_choice.allowed_tools names {unknown}, which are not in "
                          "'tools'", param="tool_choice.allowed_tools.tools")
    offered = [tool for tool in tools if tool["name"] in names]
    return offered, ("any" if choice.allowed_tools.mode == "required" else None)


def _parse_arguments(raw: str | dict[str, Any], where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise bad_request(f"{where}: arguments are not valid JSON ({exc})", param=where) from None
    if not isinstance(value, dict):
        raise bad_request(f"{where}: arguments must be a JSON object", param=where)
    return value


def _tool_result(content: str) -> Any:
    # Structured results stay structured in the tool-result JSON; anything else is a string.
    try:
        return json.loads(content)
    except (json.JSONDecodeError, ValueError):
        return content


def checked_query(text: str, param: str) -> str:
    """`text`, or a 400 naming `param` when it is empty or blank: the library's own query
    check (`api.needle.check_query`), the one rule for what can be answered."""
    try:
        return check_query(text)
    except InvalidQueryError as error:
        raise bad_request(f"Invalid '{param}': {error}", param=param,
                          code="empty_query") from None


def _text(message: ChatMessage, index: int) -> str:
    try:
        return message.text()
    except ValueError as exc:
        raise bad_request(str(exc), param=f"messages.{index}.content") from None


def from_messages(
    messages: list[ChatMessage],
    tools: list[ToolSpec] | None,
    tool_choice: str | NamedToolChoice | AllowedToolChoice | None,
) -> ClientChat:
    tool_list, force = _tools(tools, tool_choice)
    system: list[str] = []
    chat: list[dict[str, Any]] = []
    open_calls: dict[str, str] = {}  # tool_call_id -> name, for the latest assistant message
    for index, message in enumerate(messages):
        role = message.role
        if role in ("system", "developer"):
            system.append(_text(message, index))
        elif role == "user":
            text = checked_query(_text(message, index), f"messages.{index}.content")
            open_calls.clear()  # a user message closes the calls it follows
            if chat and chat[-1]["role"] == "user":  # consecutive user messages: one turn
                chat[-1]["content"] = f"{chat[-1]['content']}\n{text}"
            else:
                chat.append({"role": "user", "content": text})
        elif role == "assistant":
            if not chat or chat[-1]["role"] == "assistant":
                raise bad_request(
                    f"messages.{index}: an assistant message must follow a user or tool message",
                    param=f"messages.{index}",
                )
            chat.append(_assistant(message, index, open_calls))
        else:  # tool
            name = open_calls.get(message.tool_call_id or "")
            if name is None:
                raise bad_request(
                    f"messages.{index}: tool_call_id {message.tool_call_id!r} answers no "
                    "tool call of the preceding assistant message",
                    param=f"messages.{index}.tool_call_id",
                )
            if message.name is not None and message.name != name:
                raise bad_request(
                    f"messages.{index}: name {message.name!r} is not the tool the call "
                    f"{message.tool_call_id!r} named ({name!r})", param=f"messages.{index}.name")
            chat.append({"role": "tool", "name": name,
                         "content": _tool_result(_text(message, index))})
    if not chat or chat[0]["role"] != "user":
        raise bad_request("messages must contain a user message", param="messages")
    if chat[-1]["role"] == "assistant":
        raise bad_request(
            "the last message must be a user or tool message: that is what the model answers",
            param="messages",
        )
    text = "\n".join(system)
    head = [{"role": "system", "content": text}] if text else []
    return ClientChat(Chat(head + chat), tools=tool_list, force=force)


def _assistant(message: ChatMessage, index: int, open_calls: dict[str, str]
               ) -> dict[str, Any]:
    open_calls.clear()
    if not message.tool_calls:
        return {"role": "assistant", "content": _text(message, index), "tool_calls": None}
    calls = []
    for k, call in enumerate(message.tool_calls):
        where = f"messages.{index}.tool_calls.{k}"
        calls.append(
            {
                "name": call.function.name,
                "arguments": _parse_arguments(call.function.arguments, f"{where}.function"),
            }
        )
        if call.id:
            open_calls[call.id] = call.function.name
    return {"role": "assistant", "content": "", "tool_calls": calls}
