"""OpenAI chat messages -> a Needle conversation (system text, tools, turns, forcing).

Needle's wire format has one system turn, a first user turn that carries the tools JSON, and
(our multi-turn convention, `formats/needle_wire.py`) later user turns after each assistant answer;
tool results go back as a user turn `<tool_result>[{"name", "result"}, ...]</tool_result>`.
The mapping:

* `system`/`developer` messages (anywhere) -> the system text, joined by newlines.
* the first user message -> the query of the first turn (consecutive user messages join).
* an assistant message -> the model's earlier answer: its `tool_calls` (arguments parsed from
  their JSON text) or, without calls, its text.
* `tool` messages after an assistant message -> one user turn of tool results, in the order
  the client sent them, each named after the call its `tool_call_id` answers.
* the conversation must end on a user or tool turn: that is what the model answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .errors import bad_request
from .schemas import AllowedToolChoice, ChatMessage, NamedToolChoice, ToolSpec


@dataclass
class AssistantTurn:
    calls: list[dict[str, Any]] | None = None  # [{"name", "arguments": dict}], or
    text: str = ""  # a plain answer when there are no calls


@dataclass
class Turn:
    """A user turn and the assistant's answer to it (None for the turn to be answered)."""

    user: str = ""
    tool_results: list[dict[str, Any]] | None = None  # set for a tool-result turn
    answer: AssistantTurn | None = None


@dataclass
class Conversation:
    system: str
    tools: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    force: str | None = None  # None, "any" (a call is required) or the one required name

    @property
    def query(self) -> str:
        return self.turns[0].user

    @property
    def history(self) -> list[Turn]:
        return self.turns[:-1]

    @property
    def last(self) -> Turn:
        return self.turns[-1]


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


def _text(message: ChatMessage, index: int) -> str:
    try:
        return message.text()
    except ValueError as exc:
        raise bad_request(str(exc), param=f"messages.{index}.content") from None


def from_messages(
    messages: list[ChatMessage],
    tools: list[ToolSpec] | None,
    tool_choice: str | NamedToolChoice | AllowedToolChoice | None,
) -> Conversation:
    tool_list, force = _tools(tools, tool_choice)
    system: list[str] = []
    turns: list[Turn] = []
    open_calls: dict[str, str] = {}  # tool_call_id -> name, for the latest assistant message
    for index, message in enumerate(messages):
        role = message.role
        if role in ("system", "developer"):
            system.append(_text(message, index))
        elif role == "user":
            text = _text(message, index)
            if not text.strip():
                raise bad_request(
                    f"messages.{index}: the user message is empty; there is nothing to answer",
                    param=f"messages.{index}.content", code="empty_query")
            open_calls.clear()  # a user message closes the calls it follows
            if turns and turns[-1].answer is None:  # consecutive user-side messages: one turn
                last = turns[-1]
                last.user = f"{last.user}\n{text}" if last.user else text
            else:
                turns.append(Turn(user=text))
        elif role == "assistant":
            if not turns or turns[-1].answer is not None:
                raise bad_request(
                    f"messages.{index}: an assistant message must follow a user or tool message",
                    param=f"messages.{index}",
                )
            turns[-1].answer = _assistant(message, index, open_calls)
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
            result = {"name": name, "result": _tool_result(_text(message, index))}
            if turns[-1].answer is None and turns[-1].tool_results is not None:
                turns[-1].tool_results.append(result)
            else:
                turns.append(Turn(tool_results=[result]))
    if not turns or turns[0].tool_results is not None:
        raise bad_request("messages must contain a user message", param="messages")
    if turns[-1].answer is not None:
        raise bad_request(
            "the last message must be a user or tool message: that is what the model answers",
            param="messages",
        )
    return Conversation(system="\n".join(system), tools=tool_list, turns=turns, force=force)


def _assistant(message: ChatMessage, index: int, open_calls: dict[str, str]) -> AssistantTurn:
    open_calls.clear()
    if not message.tool_calls:
        return AssistantTurn(text=_text(message, index))
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
    return AssistantTurn(calls=calls)
