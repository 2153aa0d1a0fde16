"""Tool-call syntaxes of chat templates: the syntax is chosen once from each fixture's
template (`syntaxes.syntax_for`) and reads the template's own calls back, the tool request
renders to exactly the reference's prompt 2 ids and the whole `chat_example` to its ids
(tools as the template reads them, past calls' arguments as objects, tool results as given,
Gemma's `<bos>` from the template only, Qwen3's `enable_thinking`), and FunctionGemma's call
text reads back as OpenAI tool calls, streamed in any cut."""

from __future__ import annotations

import json

import pytest
from hf_helpers import hf_reference

from needlepoint.errors import ToolFormatError
from needlepoint.formats.chat_format import TemplateFormat
from needlepoint.formats.hf_checkpoint import open_hf_directory
from needlepoint.generation.call_syntax import JsonBlocks
from needlepoint.generation.syntax_functiongemma import FunctionGemmaToJson, functiongemma_calls
from needlepoint.generation.syntaxes import syntax_for

FIXTURES = {"qwen2-tiny": "qwen", "qwen3-tiny": "qwen", "gemma3-tiny": "functiongemma"}


def _fixture(name: str):
    ref = hf_reference(name)
    example = json.loads((ref.folder / "chat_example.json").read_text())
    return ref, open_hf_directory(ref.folder).tokenizer, example


def _openai_messages(messages):
    """The example's messages as a Needle history holds them (calls as `{"name",
    "arguments"}` with the arguments an object)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [c["function"] for c in m["tool_calls"]]
        out.append(m)
    return out


@pytest.mark.parametrize("name", list(FIXTURES))
def test_syntax_is_read_off_the_template(name) -> None:
    _, tokenizer, example = _fixture(name)
    fmt = TemplateFormat(tokenizer, template_kwargs=example["template_kwargs"])
    syntax = syntax_for(fmt)
    assert syntax.name == FIXTURES[name] and syntax_for(fmt) is syntax  # chosen once
    assert syntax.body == "object"
    if name.startswith("qwen"):
        assert syntax.layout == JsonBlocks("\n", "\n", "\n")  # <tool_call>\n{...}\n</tool_call>\n
        assert (syntax.open, syntax.close) == ("<tool_call>", "</tool_call>")
        assert syntax.translator() is None
    else:
        assert (syntax.open, syntax.close) == ("<start_function_call>",
                                               "<end_function_call>")
        assert syntax.translator() is FunctionGemmaToJson
    calls = [c["function"] for c in example["messages"][1]["tool_calls"]]
    rendered = fmt.render([{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": "", "tool_calls": example["messages"][1]["tool_calls"]}],
        None, False)
    answer = rendered[rendered.index(syntax.open):]  # the template's own calls read back
    assert syntax.parse(answer) == calls


@pytest.mark.parametrize("name", list(FIXTURES))
def test_tool_request_renders_to_the_reference_prompt_ids(name) -> None:
    ref, tokenizer, example = _fixture(name)
    fmt = TemplateFormat(tokenizer, template_kwargs=example["template_kwargs"])
    tools = [t.get("function", t) for t in example["tools"]]
    messages = _openai_messages(example["messages"])
    ids = fmt.conversation_ids(messages[:1], tools)
    assert ids == ref["p2_ids"].tolist()
    if name == "gemma3-tiny":  # the template's own <bos>, not a second one
        assert ids[0] == tokenizer.bos_id and ids.count(tokenizer.bos_id) == 1
    assert fmt.conversation_ids(messages, tools) == example["ids"]


def test_qwen3_enable_thinking_is_passed_to_the_template() -> None:
    _, tokenizer, example = _fixture("qwen3-tiny")
    tools = [t["function"] if "function" in t else t for t in example["tools"]]
    query = [{"role": "user", "content": "hi"}]
    off = TemplateFormat(tokenizer).variant(template_kwargs={"enable_thinking": False})
    on = TemplateFormat(tokenizer)
    think = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    off_ids, on_ids = off.conversation_ids(query, tools), on.conversation_ids(query, tools)
    assert off_ids[-len(think):] == think and on_ids == off_ids[: -len(think)]
    assert TemplateFormat(tokenizer).variant(template_kwargs={"enable_thinking": False}) is not on


def test_tool_format_names_and_errors() -> None:
    _, gemma, _ = _fixture("gemma3-tiny")
    _, qwen, _ = _fixture("qwen2-tiny")
    with pytest.raises(ToolFormatError, match="'xml'.*auto, hermes, functiongemma, qwen"):
        syntax_for(TemplateFormat(qwen, tool_format="xml"))
    with pytest.raises(ToolFormatError, match="no <start_function_call>"):
        syntax_for(TemplateFormat(qwen, tool_format="functiongemma"))
    with pytest.raises(ToolFormatError, match="'qwen': the chat template writes FunctionGemma"):
        syntax_for(TemplateFormat(gemma, tool_format="qwen"))
    hermes = syntax_for(TemplateFormat(qwen, tool_format="hermes"))
    assert hermes.name == "hermes" and hermes.body == "list"


def test_a_template_with_an_unknown_call_syntax_is_a_clear_error_once_tools_are_offered() -> None:
    _, tokenizer, _ = _fixture("qwen2-tiny")

    class Other:  # the same tokenizer with a template that renders calls as <call>...</call>
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        chat_template = ("{% for t in tools or [] %}TOOL {{ t | tojson }}\n{% endfor %}"
                         "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
                         "{% for c in m.get('tool_calls') or [] %}<call>{{ c['function'] | "
                         "tojson }}</call>{% endfor %}<|im_end|>\n{% endfor %}")

    fmt = TemplateFormat(Other())
    syntax = syntax_for(fmt)
    assert fmt.renders_tools and syntax.name == "unknown"
    assert fmt.conversation_ids([{"role": "user", "content": "hi"}], [])  # chat still works
    syntax.check_tools([])
    with pytest.raises(ToolFormatError, match="call syntax needlepoint does not know.*"
                                              "--tool-format"):
        syntax.check_tools([{"name": "f"}])
    assert syntax_for(TemplateFormat(Other(), tool_format="qwen")).name == "qwen"


def test_functiongemma_calls_read_back_as_openai_calls() -> None:
    _, _, example = _fixture("gemma3-tiny")
    expected = [c["function"] for c in example["messages"][1]["tool_calls"]]
    assert functiongemma_calls(example["rendered"]) == expected
    text = ("<start_function_call>call:f{n:3,x:-1.5e3,b:true,z:null,s:<escape>a \"q\"\n"
            "<escape>,o:{a:[1,<escape>x<escape>,{q:false}],e:{}},l:[]}<end_function_call>")
    assert functiongemma_calls(text) == [{"name": "f", "arguments": {
        "n": 3, "x": -1500.0, "b": True, "z": None, "s": 'a "q"\n',
        "o": {"a": [1, "x", {"q": False}], "e": {}}, "l": []}}]
    with pytest.raises(ValueError):
        functiongemma_calls("<start_function_call>call:f{n:3")


def test_functiongemma_translation_streams_in_any_cut() -> None:
    body = "call:f{s:<escape>a<b>,c<escape>,n:[1,2.5],o:{k:null}}"
    whole = FunctionGemmaToJson()
    expected = whole.feed(body) + whole.finish()
    assert json.loads(expected) == {"name": "f", "arguments": {"s": "a<b>,c", "n": [1, 2.5],
                                                               "o": {"k": None}}}
    for size in range(1, len(body)):
        translator = FunctionGemmaToJson()
        out = "".join(translator.feed(body[k : k + size]) for k in range(0, len(body), size))
        assert out + translator.finish() == expected, size
    free = FunctionGemmaToJson()  # not the syntax (an unconstrained answer): passed through
    assert free.feed("hello {x") + free.finish() == "hello {x"
