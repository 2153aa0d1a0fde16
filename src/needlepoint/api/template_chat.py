"""Conversations of a template model (`formats.chat_format.TemplateFormat`, e.g. SmolLM2).

Such a model's history is rendered by its chat template as a whole, not appended turn by
turn: every later turn renders the whole chat (`chat.Chat`: earlier answers as the calls or
text they gave, tool results as `tool` messages), and the session keeps the longest prefix of
ids it has already consumed (`Conversation.resume`: a transformer session rewinds by cutting
its KV cache), so only what is new is prefilled. Answers are decoded under one whole-answer
grammar (`generation/answer_grammar.py`, planned by `planner.TurnPlanner`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import NeedlepointError
from ..generation.events import DeltaEvent, Done
from .chat_state import ChatState
from .planner import TurnPlanner
from .results import annotated

__all__ = ["template_turn"]


def template_turn(planner: TurnPlanner, state: ChatState, options: dict[str, Any]
                  ) -> Iterator[DeltaEvent | Done]:
    """Decode the assistant's next turn of the chat (which ends on a user or tool message)."""
    conversation = state.conversation
    if conversation is None:
        raise NeedlepointError("no conversation to continue")
    plan = planner.plan(state.specs, options)
    tools = [spec.schema() for spec in state.specs]
    ids = planner.format.conversation_ids(state.chat.messages, tools)
    new_ids = conversation.resume(ids)
    events = conversation.turn(new_ids, plan.config, plan.grammar, content=plan.content,
                               check_tools=plan.check_tools, parallel_calls=plan.parallel)
    for event in annotated(events, plan.notes):
        if isinstance(event, Done):
            state.chat.add_answer(event.envelope, conversation.last_answer)
        yield event
