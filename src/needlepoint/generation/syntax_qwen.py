"""The `qwen` call syntax: one `<tool_call>` block of one JSON call object per call.

What Qwen2.5, Qwen3 and their fine-tunes (and Hermes 2 Pro) render: several blocks are
parallel calls. The block's exact layout (Qwen's `<tool_call>\\n{...}\\n</tool_call>`, the
text between blocks) is read off the template by rendering a probe call
(`call_syntax.JsonBlocks.probe`), and the call grammar follows it.
"""

from __future__ import annotations

from typing import ClassVar

from ..formats.chat_format import TemplateFormat
from .call_syntax import JsonBlocks, JsonSyntax, require_template_tools


class QwenSyntax(JsonSyntax):
    name: ClassVar[str] = "qwen"
    title: ClassVar[str] = "Qwen's <tool_call> JSON blocks"

    @classmethod
    def detects(cls, fmt: TemplateFormat) -> bool:
        return JsonBlocks.probe(fmt, cls.open, cls.close) is not None

    @classmethod
    def for_format(cls, fmt: TemplateFormat) -> QwenSyntax:
        require_template_tools(cls.name, fmt)
        return cls(JsonBlocks.probe(fmt, cls.open, cls.close))
