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
  matched as text when they are not single tokens (as vLLM's tool parsers do). The call
  syntax (`hermes`, `qwen`, `functiongemma`, one class each in `generation/`) is chosen from
  the template, or named by `tool_format`; `template_kwargs` (Qwen3's `enable_thinking`) are
  passed to the template. Tools go to the template as it reads them (OpenAI's
  `{"type": "function", "function": {...}}`, or the bare function dict when that is what it
  reads), past calls with their arguments as objects, tool results as the strings they are.

Messages are OpenAI-shaped dicts: `{"role": "user" | "system", "content": str}`,
`{"role": "assistant", "content": str, "tool_calls": [{"name", "arguments"}] | None}`,
`{"role": "tool", "name": str, "content": result}` (a result is any JSON value).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..errors import TokenizerError, ToolFormatError
from . import needle_wire as wire
from .chat_template import render_chat_template

Message = Mapping[str, Any]


class ChatTokenizer(Protocol):
    """What a chat template reads from its tokenizer besides encoding: the template (None for
    a base model), where it came from (for messages), its added tokens by text (`markers`)
    and the special tokens' texts by role (`special_tokens`: "bos_token", "eos_token", ...).
    `formats.hf_tokenizer.HFTokenizer` and `formats.tokenizer.Tokenizer` declare all four."""

    chat_template: str | None
    source: str
    markers: Mapping[str, int]
    special_tokens: Mapping[str, str]

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
# the `tool_format` name of the prompt above, and the markers its calls come between
HERMES, HERMES_OPEN, HERMES_CLOSE = "hermes", "<tool_call>", "</tool_call>"


def _call_list(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": c["name"], "arguments": c.get("arguments", {})} for c in calls]


def _results(group: Sequence[Message]) -> list[dict[str, Any]]:
    return [{"name": m.get("name", ""), "result": m.get("content")} for m in group]


def tool_results(group: Sequence[Message]) -> list[dict[str, Any]]:
    """`tool` messages as Needle's format reports results, `[{"name", "result" | "error"}]`:
    a content of exactly `{"error": message}` is a failed call (as `api.chat` writes one)."""
    out = []
    for message in group:
        content = message.get("content")
        if isinstance(content, dict) and set(content) == {"error"}:
            out.append({"name": message.get("name", ""), "error": content["error"]})
        else:
            out.append({"name": message.get("name", ""), "result": content})
    return out


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
        """The one multi-turn step of Needle's format (`conversation_ids`,
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

    def answer_ids(self, message: Message) -> list[int]:
        """An earlier assistant message's ids: its answer text encoded on its own."""
        return self.tokenizer.encode(self.answer_text(str(message.get("content") or ""),
                                                      message.get("tool_calls")))

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
            answer_ids = self.answer_ids(answer)
            k += 1
            group = []
            while k < len(rest) and rest[k].get("role") == "tool":
                group.append(rest[k])
                k += 1
            user = str(rest[k].get("content") or "") if k < len(rest) and \
                rest[k].get("role") == "user" else ""
            k += 1 if user or (k < len(rest) and rest[k].get("role") == "user") else 0
            parts = [self.tool_results_content(tool_results(group))] if group else []
            if user:
                parts.append(user)
            if not parts:
                raise ValueError("an assistant turn must be followed by a user or tool turn")
            ids += self.next_turn_ids(answer_ids, "\n".join(parts))
        return ids


class TemplateFormat:
    """A Hugging Face chat template; a Hermes-style tool prompt when it renders no tools.

    The call syntax a template model writes is chosen once from this format by
    `generation/syntaxes.py` (`syntax_for`); what it reads here is the template (`template`,
    `render`), whether it renders tools (`renders_tools`), the tokenizer's added tokens
    (`markers`), the `tool_format` asked for ("auto" or a syntax's name) and whether the tools
    go in needlepoint's own prompt (`uses_tool_prompt`)."""

    name = "template"
    json_style = "spaced"  # calls as json.dumps writes them: `{"name": ..., "arguments": ...}`

    def __init__(self, tokenizer: ChatTokenizer, tool_format: str | None = None,
                 template_kwargs: Mapping[str, Any] | None = None) -> None:
        if not tokenizer.chat_template:
            where = tokenizer.source or "this model"
            raise TokenizerError(
                f"{where} has no chat template (a base model): it cannot chat or call tools; "
                "continue plain text with `needlepoint run --raw TEXT --model MODEL` "
                "or use an instruct model")
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.tool_format = "auto" if tool_format is None else str(tool_format)
        self._variants: dict[Any, TemplateFormat] = {}
        self.markers: dict[str, int] = dict(tokenizer.markers)
        self.special_tokens: dict[str, str] = dict(tokenizer.special_tokens)
        self.tools_shape = self._tools_shape()
        self.renders_tools = self.tools_shape is not None
        # the Hermes-style prompt shows the tools when asked for, or when the template has no
        # place for them
        self.uses_tool_prompt = self.tool_format == HERMES or (
            self.tool_format == "auto" and not self.renders_tools)
        self.think_ids = self._think_ids(self.markers)
        self.thinking = self.think_ids is not None
        ends = [self.markers[m] for m in END_MARKERS if m in self.markers]
        eos = tokenizer.eos_id
        self._end_ids = tuple(dict.fromkeys([*ends[:1], *([eos] if eos is not None else [])]))
        if not self._end_ids:
            raise TokenizerError(f"{tokenizer!r}: no end-of-turn token (EOS or {END_MARKERS})")

    def _think_ids(self, markers: Mapping[str, int]) -> tuple[int, int] | None:
        """(`<think>`, `</think>`) ids when the model may reason before answering: its template
        knows think blocks and its generation prompt does not close one already (Qwen3 with
        `enable_thinking` false appends an empty `<think>\n\n</think>\n\n`)."""
        if "<think>" not in self.template or "<think>" not in markers or \
                "</think>" not in markers:
            return None
        prompt = self.render([{"role": "user", "content": "hi"}])
        if prompt.rstrip().endswith("</think>"):
            return None
        return markers["<think>"], markers["</think>"]

    def variant(self, tool_format: str | None = None,
                template_kwargs: Mapping[str, Any] | None = None) -> TemplateFormat:
        """This format with another `tool_format` / `template_kwargs` (memoised: a server makes
        a `Needle` per request, and each format has its own turn vocabulary)."""
        kwargs = {**self.template_kwargs, **(template_kwargs or {})}
        fmt = self.tool_format if tool_format is None else str(tool_format)
        if fmt == self.tool_format and kwargs == self.template_kwargs:
            return self
        key = (fmt, json.dumps(kwargs, sort_keys=True, default=str))
        if key not in self._variants:
            self._variants[key] = TemplateFormat(self.tokenizer, fmt, kwargs)
        return self._variants[key]

    @property
    def end_ids(self) -> tuple[int, ...]:
        return self._end_ids

    def render(self, messages: Sequence[Message], tools: Any = None,
               generation_prompt: bool = True) -> str:
        """The template's text for `messages` (`tools`: the tools argument as it reads it)."""
        return render_chat_template(self.template, messages, tools=tools,
                                    add_generation_prompt=generation_prompt,
                                    special_tokens=self.special_tokens, **self.template_kwargs)

    def _tools_shape(self) -> str | None:
        """How the template reads a tool: "openai" (`{"type": "function", "function": {...}}`,
        what OpenAI clients send and most templates print), "plain" (the function dict: a
        template that wraps it itself, or reads `tool['name']`), None: it renders no tools."""
        function = {"name": "zq_probe_tool", "description": "zq", "parameters": {}}
        seen = {}
        for shape, tool in (("plain", function),
                            ("openai", {"type": "function", "function": function})):
            try:
                text = self.render([{"role": "user", "content": "hi"}], [tool])
            except TokenizerError:
                continue
            if "zq_probe_tool" in text:
                seen[shape] = text
        if "plain" in seen and ('"function"' in seen["plain"] or "openai" not in seen):
            return "plain"  # the template writes the wrapper itself, or only reads the dict
        return "openai" if "openai" in seen else None

    def _tools_arg(self, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if self.tools_shape == "plain":
            return [dict(t) for t in tools]
        return [{"type": "function", "function": dict(t)} for t in tools]

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
            return f"{HERMES_OPEN}{body}{HERMES_CLOSE}"
        return text

    def messages(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]
                 ) -> tuple[list[dict[str, Any]], Any]:
        """The messages and tools argument the template renders."""
        system, rest = split_turns(messages)
        if tools and not self.uses_tool_prompt:
            tools_arg = self._tools_arg(tools)
            out = [{"role": "system", "content": system}] if system else []
            for m in rest:
                if m.get("role") == "assistant" and m.get("tool_calls"):
                    calls = [{"type": "function", "function": c}
                             for c in _call_list(m["tool_calls"])]
                    out.append({"role": "assistant", "content": m.get("content") or "",
                                "tool_calls": calls})
                elif m.get("role") == "tool":
                    content = m.get("content")  # a string as given (OpenAI), else its JSON
                    out.append({"role": "tool", "name": m.get("name", ""), "content": content
                                if isinstance(content, str) else
                                json.dumps(content, ensure_ascii=False)})
                else:
                    out.append(dict(m))
            return out, tools_arg
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
        text = self.render(rendered, tools_arg)
        bos = self.special_tokens.get("bos_token")
        starts_with_bos = bool(bos) and text.startswith(bos)
        return list(self.tokenizer.encode(text, add_special_tokens=not starts_with_bos))

    def first_ids(self, tools: Sequence[Mapping[str, Any]], query: str,
                  system: str = "") -> list[int]:
        head = [{"role": "system", "content": system}] if system else []
        return self.conversation_ids([*head, {"role": "user", "content": query}], tools)


def with_call_options(chat_format: NeedleFormat | TemplateFormat, tool_format: str | None,
                      template_kwargs: Mapping[str, Any] | None) -> NeedleFormat | TemplateFormat:
    """`chat_format` with a `tool_format` / `template_kwargs` (`Needle(tool_format=,
    template_kwargs=)`, `--tool-format`, a request's `chat_template_kwargs`); Needle's wire
    format has neither (ToolFormatError when one is asked of it). Whether the named syntax
    exists and fits the template is `generation/syntaxes.py`'s to say."""
    if tool_format in (None, "auto") and not template_kwargs:
        return chat_format
    if not isinstance(chat_format, TemplateFormat):
        raise ToolFormatError(f"tool_format / template_kwargs apply to chat-template models; "
                              f"this model speaks {chat_format.name!r}")
    return chat_format.variant(tool_format, template_kwargs)


def parse_template_kwargs(text: str) -> dict:
    """`--chat-template-kwargs` of run / chat / serve: a JSON object of chat-template
    variables (`{"enable_thinking": false}`, as llama.cpp's server takes it); ValueError with
    the reason otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object of template variables, got {text!r}")
    return value
