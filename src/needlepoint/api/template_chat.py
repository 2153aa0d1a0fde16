"""Conversations of a template model (`formats.chat_format.TemplateFormat`, e.g. SmolLM2).

Such a model's history is rendered by its chat template as a whole, not appended turn by
turn: every later turn renders all messages so far (earlier answers as the calls or text they
gave, tool results as `tool` messages), and the session keeps the longest prefix of ids it has
already consumed (`Conversation.resume`: a transformer session rewinds by cutting its KV
cache), so only what is new is prefilled. Answers are decoded under one whole-answer grammar
(`generation/answer_grammar.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import InvalidOptionError
from ..generation.answer_grammar import AUTO_CALL_THRESHOLD
from ..generation.events import DeltaEvent, Done
from .plan import Plan
from .results import annotated

__all__ = ["answer_plan", "assistant_message", "template_turn", "tool_messages"]


def answer_plan(needle: Any, specs: Sequence[Any], options: dict[str, Any],
                schema: dict[str, Any] | None, parallel: bool) -> Any:
    """A template model's turn plan: one grammar over the whole answer, so answering vs
    calling is the grammar's first choice; no tools, or `allow_call=False`, is a plain text
    answer (with a `response_format`, JSON)."""
    options = {"reasoning_budget": None, "call_threshold": AUTO_CALL_THRESHOLD, **options}
    if not specs and options.get("require_call"):
        raise InvalidOptionError("require_call needs at least one tool to call")
    if not specs:
        options["allow_call"] = False
    config = needle.config(**options)
    tools = [spec.schema() for spec in specs]
    grammars = needle._grammars
    content = None
    if schema is not None and not config.require_call:
        content = grammars.content(schema, allow_call=config.allow_call, tools=tools,
                                   parallel_calls=parallel)
    elif config.allow_call:
        content = grammars.calls(tools, require_call=config.require_call,
                                 parallel_calls=parallel)
    check = None if grammars.tool_grammar else tools
    return Plan(config, None, content, check, parallel, {})


def assistant_message(envelope: dict[str, Any]) -> dict[str, Any]:
    """The assistant message a finished turn adds to the history."""
    calls = envelope.get("function_calls") or None
    return {"role": "assistant", "content": envelope.get("text", ""), "tool_calls": calls}


def tool_messages(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`[{"name", "result" | "error"}]` as `tool` messages."""
    return [{"role": "tool", "name": r.get("name", ""),
             "content": r["result"] if "result" in r else {"error": r.get("error")}}
            for r in results]


def history(needle: Any) -> list[dict[str, Any]]:
    system = needle.system_text()
    return ([{"role": "system", "content": system}] if system else []) + needle._messages


def template_turn(needle: Any, added: list[dict[str, Any]], options: dict[str, Any]
                  ) -> Iterator[DeltaEvent | Done]:
    """Add `added` messages to the conversation and decode the assistant's next turn."""
    plan = needle._plan(needle._turn_specs, options)
    needle._messages.extend(added)
    tools = [spec.schema() for spec in needle._turn_specs]
    ids = needle.format.conversation_ids(history(needle), tools)
    conversation = needle._conversation
    new_ids = conversation.resume(ids)
    events = conversation.turn(new_ids, plan.config, plan.grammar, content=plan.content,
                               check_tools=plan.check_tools, parallel_calls=plan.parallel)
    for event in annotated(events, plan.notes):
        if isinstance(event, Done):
            needle._messages.append(assistant_message(event.envelope))
        yield event
