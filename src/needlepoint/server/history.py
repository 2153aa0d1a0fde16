"""Replaying a client-supplied conversation as token ids, then decoding the next turn.

`needlepoint.api.Needle` continues conversations it generated itself (`chat`,
`send_tool_results`); an OpenAI client instead sends the whole history, earlier assistant
answers included, with every request. The server is stateless, so those answers are *fed*,
not regenerated, using the library's own multi-turn convention (`formats/needle_wire.py`):

    [BOS] first prompt (system, tools, query)
    encode(answer) <|im_end|>                          an earlier assistant turn
    \\n<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n   the next user turn

An answer is encoded on its own, as training encodes targets (so with the dummy prefix it
starts with a lone U+2581 piece, as a generated answer does); a tool-result turn's content is
`<tool_result>[{"name", "result"}, ...]</tool_result>`. The sequence equals what `Needle.chat`
/ `send_tool_results` would have built had the model given those answers itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .conversation import Conversation


def history_messages(conversation: Conversation) -> list[dict[str, Any]]:
    """The turns as chat messages (`formats.chat_format`): user text, earlier answers (calls
    or text), tool results as `tool` messages."""
    messages: list[dict[str, Any]] = []
    for turn in conversation.turns:
        for result in turn.tool_results or []:
            messages.append({"role": "tool", "name": result["name"],
                             "content": result["result"]})
        if turn.user:
            messages.append({"role": "user", "content": turn.user})
        if turn.answer is not None:
            messages.append({"role": "assistant", "content": turn.answer.text,
                             "tool_calls": turn.answer.calls})
    return messages


def history_ids(needle: Any, conversation: Conversation) -> list[int]:
    """Token ids of the whole conversation up to the assistant turn to be generated, built
    by the model's chat format (`formats/chat_format.py`: a chat template renders it whole;
    Needle's format appends turns as described above)."""
    system = needle.system_text()
    head = [{"role": "system", "content": system}] if system else []
    tools = [spec.schema() for spec in needle.offered_tools(conversation.query)]
    return needle.format.conversation_ids(head + history_messages(conversation), tools)


def stream_ids(
    needle: Any, ids: list[int], options: dict[str, Any], query: str
) -> Iterator[Any]:
    """Decode one assistant turn after `ids` on a fresh session, with the needle's settings
    and a tool-call grammar for the tools the conversation's first prompt offered (all of
    them, or the retrieved top k on a model with a contrastive head), so the model can only
    call a tool it was shown (events as `Needle.stream` yields them)."""
    return needle.stream_ids(ids, query, **options)
