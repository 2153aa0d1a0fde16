"""Chat formats: how a model's conversations (messages, tools, tool results) become token ids.

A model supplies its format (`model.chat_format`, `models/protocol.py`):

* `NeedleFormat`: Needle's own wire format (`needle_wire.py`, the fixture README "Prompt wire
  format"): tools in the user turn, one `<tool_call>[...]</tool_call>` list per answer, every
  marker a single added token.
* `TemplateFormat`: a Hugging Face chat template (`tokenizer_config.json` `chat_template` or
  GGUF `tokenizer.chat_template`, rendered with jinja2 as transformers renders it). When the
  template renders `tools` itself they go to it; when it does not (SmolLM2's template) a
  Hermes-style tool prompt goes in the system turn: the tools as JSON inside
  `<tools></tools>`, calls as `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`,
  results as `<tool_response>...</tool_response>` in a user turn. The call markers are
  matched as text when they are not single tokens (as vLLM's tool parsers do).

Messages are OpenAI-shaped dicts: `{"role": "user" | "system", "content": str}`,
`{"role": "assistant", "content": str, "tool_calls": [{"name", "arguments"}] | None}`,
`{"role": "tool", "name": str, "content": result}` (a result is any JSON value).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import TokenizerError
from . import needle_wire as wire
from .chat_template import render_chat_template

Message = Mapping[str, Any]
END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>{tools}</tools>\n"
    "For each function call return a JSON list of objects with function name and arguments "
    "within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>[{{"name": <function-name>, "arguments": <args-dict>}}]</tool_call>'
)
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def _call_list(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": c["name"], "arguments": c.get("arguments", {})} for c in calls]


def _results(group: Sequence[Message]) -> list[dict[str, Any]]:
    return [{"name": m.get("name", ""), "result": m.get("content")} for m in group]


def split_turns(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    """(system text, the other messages); a ValueError unless they start with a user turn."""
    system = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    if not rest or rest[0].get("role") != "user":
        raise ValueError("a conversation starts with a user message")
    return "\n".join(system), rest


class NeedleFormat:
    """Needle's wire format (`needle_wire.py`): its exact prompts."""

    name = "needle"
    call_open, call_close = wire.TOOL_CALL_OPEN, wire.TOOL_CALL_CLOSE
    call_body = "list"  # one JSON list of calls between the markers
    marker_tokens = True  # every marker is one added token

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn (the first one closes a turn in a history)."""
        return (self.tokenizer.marker_id(wire.IM_END), self.tokenizer.eos_id)

    def first_ids(self, tools: Sequence[Mapping[str, Any]], query: str,
                  system: str = "") -> list[int]:
        """The first turn's ids: `[BOS] + system, tools and query`."""
        return wire.prompt_ids(self.tokenizer, wire.render_prompt(tools, query, system))

    def user_ids(self, content: str) -> list[int]:
        """A later user turn, right after the previous turn's `<|im_end|>`."""
        return wire.continuation_ids(self.tokenizer, wire.render_user_turn(content))

    def tool_results_content(self, results: Sequence[Mapping[str, Any]]) -> str:
        """The user-turn content that carries `[{"name", "result"}]` back to the model."""
        return wire.render_tool_results(results)

    def next_turn_ids(self, answer: Sequence[int], content: str) -> list[int]:
        """The one multi-turn step of Needle's format (issue 27 item 4; `conversation_ids`,
        `Needle.chat` and the replay of kept turns all use it): an assistant answer's tokens
        (EOS dropped, closed by `<|im_end|>` unless they end with it), then the next user
        turn with `content`."""
        im_end, eos = self.end_ids
        tokens = [int(t) for t in answer if t != eos]
        if not tokens or tokens[-1] != im_end:
            tokens.append(im_end)
        return tokens + self.user_ids(content)

    def answer_text(self, text: str, calls: Sequence[Mapping[str, Any]] | None) -> str:
        """An earlier assistant answer as the model writes it."""
        if calls:
            return f"{self.call_open}{wire.compact_json(_call_list(calls))}{self.call_close}"
        return text

    def conversation_ids(self, messages: Sequence[Message],
                         tools: Sequence[Mapping[str, Any]]) -> list[int]:
        """Every id up to the assistant turn to be generated (the multi-turn convention of
        `needle_wire`: answers encoded on their own, then `<|im_end|>`, then the next user
        turn, whose content is the tool results and/or the user's text)."""
        system, rest = split_turns(messages)
        ids = self.first_ids(tools, str(rest[0].get("content") or ""), system)
        k = 1
        while k < len(rest):
            answer = rest[k]
            if answer.get("role") != "assistant":
                raise ValueError(f"message {k}: expected an assistant turn")
            answer_ids = self.tokenizer.encode(self.answer_text(
                str(answer.get("content") or ""), answer.get("tool_calls")))
            k += 1
            group = []
            while k < len(rest) and rest[k].get("role") == "tool":
                group.append(rest[k])
                k += 1
            user = str(rest[k].get("content") or "") if k < len(rest) and \
                rest[k].get("role") == "user" else ""
            k += 1 if user or (k < len(rest) and rest[k].get("role") == "user") else 0
            parts = [self.tool_results_content(_results(group))] if group else []
            if user:
                parts.append(user)
            if not parts:
                raise ValueError("an assistant turn must be followed by a user or tool turn")
            ids += self.next_turn_ids(answer_ids, "\n".join(parts))
        return ids


class TemplateFormat:
    """A Hugging Face chat template; a Hermes-style tool prompt when it renders no tools."""

    name = "template"
    call_open, call_close = "<tool_call>", "</tool_call>"
    json_style = "spaced"  # calls as json.dumps writes them: `{"name": ..., "arguments": ...}`

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TokenizerError(f"{tokenizer!r} has no chat template: it cannot chat")
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_template
        self.renders_tools = self._renders_tools()
        # templates that render tools ask for one call object per marker pair (Hermes / Qwen
        # style); the Hermes-style prompt of this module asks for one list
        self.call_body = "object" if self.renders_tools else "list"
        markers = getattr(tokenizer, "markers", {})
        self.marker_tokens = self.call_open in markers and self.call_close in markers
        ends = [markers[m] for m in END_MARKERS if m in markers]
        eos = tokenizer.eos_id
        self._end_ids = tuple(dict.fromkeys([*ends[:1], *([eos] if eos is not None else [])]))
        if not self._end_ids:
            raise TokenizerError(f"{tokenizer!r}: no end-of-turn token (EOS or {END_MARKERS})")

    @property
    def end_ids(self) -> tuple[int, ...]:
        return self._end_ids

    def _render(self, messages: Sequence[Message], tools: Any = None) -> str:
        return render_chat_template(self.template, messages, tools=tools,
                                    add_generation_prompt=True,
                                    special_tokens=getattr(self.tokenizer, "special_tokens", {}))

    def _renders_tools(self) -> bool:
        probe = {"type": "function", "function": {"name": "zq_probe_tool", "parameters": {}}}
        try:
            text = self._render([{"role": "user", "content": "hi"}], [probe])
        except TokenizerError:
            return False
        return "zq_probe_tool" in text

    def tool_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """The Hermes-style system text that shows `tools` (template without tools)."""
        listed = [{"type": "function", "function": dict(t)} for t in tools]
        return HERMES_SYSTEM.format(tools=json.dumps(listed, ensure_ascii=False))

    def tool_results_content(self, results: Sequence[Mapping[str, Any]]) -> str:
        return "\n".join(f"{TOOL_RESPONSE_OPEN}{json.dumps(dict(r), ensure_ascii=False)}"
                         f"{TOOL_RESPONSE_CLOSE}" for r in results)

    def answer_text(self, text: str, calls: Sequence[Mapping[str, Any]] | None) -> str:
        if calls:
            body = json.dumps(_call_list(calls), ensure_ascii=False)
            return f"{self.call_open}{body}{self.call_close}"
        return text

    def messages(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]
                 ) -> tuple[list[dict[str, Any]], Any]:
        """The messages and tools argument the template renders."""
        system, rest = split_turns(messages)
        if tools and self.renders_tools:
            out = [{"role": "system", "content": system}] if system else []
            for m in rest:
                if m.get("role") == "assistant" and m.get("tool_calls"):
                    calls = [{"type": "function", "function": c}
                             for c in _call_list(m["tool_calls"])]
                    out.append({"role": "assistant", "content": m.get("content") or "",
                                "tool_calls": calls})
                elif m.get("role") == "tool":
                    out.append({"role": "tool", "name": m.get("name", ""),
                                "content": json.dumps(m.get("content"), ensure_ascii=False)})
                else:
                    out.append(dict(m))
            return out, [{"type": "function", "function": dict(t)} for t in tools]
        if tools:
            system = f"{system}\n\n{self.tool_prompt(tools)}" if system else \
                self.tool_prompt(tools)
        out = [{"role": "system", "content": system}] if system else []
        group: list[Message] = []
        for m in [*rest, {"role": "end"}]:
            if m.get("role") == "tool":
                group.append(m)
                continue
            if group:
                out.append({"role": "user", "content": self.tool_results_content(
                    _results(group))})
                group = []
            if m.get("role") == "assistant":
                out.append({"role": "assistant", "content": self.answer_text(
                    str(m.get("content") or ""), m.get("tool_calls"))})
            elif m.get("role") == "user":
                out.append({"role": "user", "content": str(m.get("content") or "")})
        return out, None

    def conversation_ids(self, messages: Sequence[Message],
                         tools: Sequence[Mapping[str, Any]]) -> list[int]:
        """Every id up to the assistant turn to be generated."""
        rendered, tools_arg = self.messages(messages, tools)
        text = self._render(rendered, tools_arg)
        specials = getattr(self.tokenizer, "special_tokens", {})
        bos = specials.get("bos_token")
        starts_with_bos = bool(bos) and text.startswith(bos)
        return list(self.tokenizer.encode(text, add_special_tokens=not starts_with_bos))

    def first_ids(self, tools: Sequence[Mapping[str, Any]], query: str,
                  system: str = "") -> list[int]:
        head = [{"role": "system", "content": system}] if system else []
        return self.conversation_ids([*head, {"role": "user", "content": query}], tools)
