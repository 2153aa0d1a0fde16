"""The `hermes` call syntax: needlepoint's own Hermes-style tool prompt.

Used when the chat template renders no tools (SmolLM2), or when `tool_format="hermes"` asks
for it: the tools go in the system turn (`formats/chat_format.HERMES_SYSTEM`) and the model
answers with one JSON list of calls, `<tool_call>[{"name": ..., "arguments": ...}]
</tool_call>`.
"""

from __future__ import annotations

from typing import ClassVar

from ..formats.chat_format import HERMES, HERMES_CLOSE, HERMES_OPEN, TemplateFormat
from .call_syntax import JsonSyntax


class HermesSyntax(JsonSyntax):
    name: ClassVar[str] = HERMES
    title: ClassVar[str] = "needlepoint's Hermes-style tool prompt"
    open, close = HERMES_OPEN, HERMES_CLOSE
    body = "list"

    @classmethod
    def detects(cls, fmt: TemplateFormat) -> bool:
        return fmt.uses_tool_prompt
