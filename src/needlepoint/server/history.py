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

from typing import Any

from .conversation import ClientChat


def history_ids(needle: Any, chat: ClientChat) -> list[int]:
    """Token ids of the whole conversation up to the assistant turn to be generated, built
    by the model's chat format from the chat's messages (`formats/chat_format.py`: a chat
    template renders it whole; Needle's format appends turns as described above)."""
    system = needle.system_text()
    head = [{"role": "system", "content": system}] if system else []
    tools = [spec.schema() for spec in needle.offered_tools(chat.query)]
    return needle.format.conversation_ids(head + chat.messages, tools)
