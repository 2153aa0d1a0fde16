"""A tool call in each family's own format through `Needle` and the server (issue 28 item 4):
llama-tiny, qwen2-tiny, qwen3-tiny and gemma3-tiny (random weights: the call is whatever the
grammar lets the model pick, checked for form, not content). The prompt of the fixtures' tool
request is the reference's prompt 2 (the server's `usage.prompt_tokens` is its length), the
answer is constrained to the family's syntax and read back as OpenAI tool calls, streamed the
same, and a tool result goes back through the model's own template.

Each family runs twice: on its own checkpoint (qwen2 / qwen3 / gemma3_text need the
transformer forward of issue 28 item 1; on a tree without it those fail at load), and on a
llama-tiny body carrying the family's tokenizer and chat template (`llama_body`): the call
syntax belongs to the template and tokenizer, not to the architecture."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hf_helpers import hf_reference
from server_helpers import ServerThread, collect_stream

import needlepoint
from needlepoint.errors import ToolFormatError
from needlepoint.server import create_app

FAMILIES = ("llama-tiny", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny")
NEW = FAMILIES[1:]
BODIES = [(name, body) for name in NEW for body in ("own", "llama")]
QUERY = "Wake me at 6:45 tomorrow, then call Ana."
# Random-weight models rarely end a free string: the call tests use finite values (enums,
# booleans) so that every call completes within the token budget, in every syntax.
FINITE = [
    {"name": "set_alarm", "description": "Set an alarm.", "parameters": {
        "type": "object", "properties": {"time": {"type": "string", "enum": ["06:45", "7"]},
                                         "loud": {"type": "boolean"}},
        "required": ["time"]}},
    {"name": "call_contact", "description": "Phone a contact.", "parameters": {
        "type": "object", "properties": {"contact": {"enum": ["Ana", "Bo", None]}},
        "required": ["contact"]}},
]


def _example(name: str) -> dict:
    return json.loads((hf_reference(name).folder / "chat_example.json").read_text())


def _tools(name: str) -> list[dict]:
    return [t.get("function", t) for t in _example(name)["tools"]]


def llama_body(name: str, out: Path) -> Path:
    """llama-tiny's blocks under fixture `name`'s tokenizer and chat template: the embedding
    and LM head resized to its vocabulary (extra rows seeded random), its BOS / EOS ids."""
    from safetensors.numpy import load_file, save_file

    llama, family = hf_reference("llama-tiny").folder, hf_reference(name).folder
    out.mkdir(parents=True, exist_ok=True)
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(family / file, out / file)
    config = json.loads((llama / "config.json").read_text())
    own = json.loads((family / "config.json").read_text())
    vocab = own["vocab_size"]
    config.update(vocab_size=vocab, bos_token_id=own.get("bos_token_id"),
                  eos_token_id=own.get("eos_token_id"))
    (out / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(llama / "model.safetensors"))
    rng = np.random.default_rng(28)
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        table = tensors[key]
        extra = rng.standard_normal((max(0, vocab - len(table)), table.shape[1]))
        tensors[key] = np.concatenate([table[:vocab], extra.astype(np.float32) * 0.5])
    save_file(tensors, str(out / "model.safetensors"))
    return out


class _Models(dict):
    """Each (fixture, body) model, loaded when a test first asks for it."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, key: tuple[str, str]):
        name, body = key
        path = hf_reference(name).folder if body == "own" else \
            llama_body(name, self.folder / name)
        self[key] = needlepoint.load(path)
        return self[key]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return _Models(tmp_path_factory.mktemp("bodies"))


def _needle(models, name: str, body: str = "own", tools=None, **options) -> needlepoint.Needle:
    kwargs = _example(name).get("template_kwargs") or None
    return needlepoint.Needle(tools=_tools(name) if tools is None else tools,
                              model=models[name, body], cache=None, template_kwargs=kwargs,
                              **options)


@pytest.mark.parametrize(("name", "body"), BODIES)
def test_the_tool_request_prompt_is_reference_prompt_2(models, name, body) -> None:
    assert _needle(models, name, body).prompt_ids(QUERY) == \
        hf_reference(name)["p2_ids"].tolist()


@pytest.mark.parametrize(("name", "body"), [("llama-tiny", "own"), *BODIES])
def test_a_required_call_is_a_declared_tool_in_the_family_format(models, name, body) -> None:
    needle = _needle(models, name, body, FINITE, max_new_tokens=96)
    envelope = needle.complete(QUERY, require_call=True)
    assert envelope["type"] == "call", envelope
    declared = {t["name"]: t for t in FINITE}
    for call in envelope["function_calls"]:
        schema = declared[call["name"]]["parameters"]
        assert set(schema.get("required", [])) <= set(call["arguments"])
        for key, value in call["arguments"].items():
            allowed = schema["properties"][key].get("enum", [True, False])
            assert value in allowed and type(value) in {type(a) for a in allowed}
    results = [{"name": c["name"], "result": {"ok": True}} for c in envelope["function_calls"]]
    after = needle.send_tool_results(results, allow_call=False, max_new_tokens=8)
    assert after["type"] == "respond" and not after["function_calls"]


def test_tool_format_is_checked_against_the_template(models) -> None:
    with pytest.raises(ToolFormatError, match="no <start_function_call>"):
        needlepoint.Needle(tools=_tools("llama-tiny"), model=models["llama-tiny", "own"],
                           cache=None, tool_format="functiongemma")
    hermes = needlepoint.Needle(tools=_tools("llama-tiny"), model=models["llama-tiny", "own"],
                                cache=None, tool_format="hermes")
    assert hermes.planner.syntax.name == "hermes" and hermes.planner.syntax.body == "list"


@pytest.fixture(scope="module")
def servers(models) -> Iterator[dict]:
    running: dict = {}

    def client(name: str, body: str):
        if (name, body) not in running:
            server = ServerThread(create_app(models[name, body], workers=1, model_name=name))
            server.__enter__()
            running[name, body] = server
        return running[name, body].client()

    yield client
    for server in running.values():
        server.__exit__(None, None, None)


@pytest.mark.parametrize(("name", "body"), [k for k in BODIES if k[0] != "qwen2-tiny"])
def test_server_tool_call_usage_and_stream(servers, models, name, body) -> None:
    client = servers(name, body)
    extra = {"chat_template_kwargs": _example(name)["template_kwargs"]} \
        if _example(name)["template_kwargs"] else None
    messages = [{"role": "user", "content": QUERY}]
    tools = [{"type": "function", "function": t} for t in _tools(name)]
    reply = client.chat.completions.create(model=name, messages=messages, tools=tools,
                                           max_tokens=1, extra_body=extra)
    assert reply.usage.prompt_tokens == len(hf_reference(name)["p2_ids"])
    tools = [{"type": "function", "function": t} for t in FINITE]
    reply = client.chat.completions.create(model=name, messages=messages, tools=tools,
                                           tool_choice="required", max_tokens=96,
                                           extra_body=extra)
    assert reply.choices[0].finish_reason == "tool_calls"
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in reply.choices[0].message.tool_calls]
    expected = _needle(models, name, body, FINITE, max_new_tokens=96).complete(
        QUERY, require_call=True)
    assert calls == [(c["name"], c["arguments"]) for c in expected["function_calls"]]
    streamed = collect_stream(client.chat.completions.create(
        model=name, messages=messages, tools=tools, tool_choice="required", max_tokens=96,
        stream=True, extra_body=extra))
    assert streamed["calls"] == calls


RESULT_SYNTAX = {"qwen": ("<tool_call>\n{\"name\": ", "<tool_response>"),
                 "functiongemma": ("<start_function_call>call:", "<start_function_response>")}


@pytest.mark.parametrize("name", NEW)
def test_server_multi_turn_with_tool_results(servers, models, name) -> None:
    """A required call (one: the fixtures' context is 512 positions), then its results sent
    back as OpenAI messages (the assistant's
    `tool_calls`, one `tool` message per call), answered as `Needle.send_tool_results`
    answers them, streamed and not; the prompt is the family's template over the whole
    history: the past call and the results in its own syntax."""
    client = servers(name, "own")
    kwargs = _example(name)["template_kwargs"]
    extra = {"chat_template_kwargs": kwargs} if kwargs else None
    tools = [{"type": "function", "function": t} for t in FINITE]
    messages: list[dict] = [{"role": "user", "content": QUERY}]
    first = client.chat.completions.create(model=name, messages=messages, tools=tools,
                                           tool_choice="required", max_tokens=96,
                                           parallel_tool_calls=False, extra_body=extra)
    calls = first.choices[0].message.tool_calls
    needle = _needle(models, name, "own", FINITE, max_new_tokens=96)
    envelope = needle.complete(QUERY, require_call=True, parallel_tool_calls=False)
    assert len(calls) == 1
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(c["name"], c["arguments"]) for c in envelope["function_calls"]]
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                      "arguments": c.function.arguments}}
        for c in calls]})
    messages += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": True})}
                 for c in calls]
    reply = client.chat.completions.create(model=name, messages=messages, tools=tools,
                                           max_tokens=48, extra_body=extra)
    after = needle.send_tool_results([{"name": c["name"], "result": {"ok": True}}
                                      for c in envelope["function_calls"]], max_new_tokens=48)
    history = [{"role": "user", "content": QUERY},
               {"role": "assistant", "content": "", "tool_calls": envelope["function_calls"]},
               *[{"role": "tool", "name": c["name"], "content": {"ok": True}}
                 for c in envelope["function_calls"]]]
    ids = needle.format.conversation_ids(history, FINITE)
    assert reply.usage.prompt_tokens == len(ids)
    past_call, result = RESULT_SYNTAX[needle.planner.syntax.name]
    rendered = needle.tokenizer.decode(ids)
    assert past_call in rendered and rendered.count(result) == len(calls)
    answer = reply.choices[0].message
    got = [(c.function.name, json.loads(c.function.arguments)) for c in answer.tool_calls or []]
    assert got == [(c["name"], c["arguments"]) for c in after["function_calls"]]
    assert (answer.content or "") == ("" if got else after["text"])
    streamed = collect_stream(client.chat.completions.create(
        model=name, messages=messages, tools=tools, max_tokens=48, stream=True,
        extra_body=extra))
    assert streamed["calls"] == got and streamed["content"] == (answer.content or "")


def test_serve_chat_template_kwargs_are_every_request_s_defaults(models) -> None:
    """`serve --chat-template-kwargs` (`server.cli.needle_factory`): the template variables of
    every request, under a request's own `chat_template_kwargs`."""
    from needlepoint.command import build_parser
    from needlepoint.formats.chat_format import TemplateFormat
    from needlepoint.server.cli import needle_factory

    args = build_parser().parse_args(["serve", "--chat-template-kwargs",
                                      '{"enable_thinking": false}', "--tool-format", "qwen"])
    assert args.chat_template_kwargs == {"enable_thinking": False}
    model = models["qwen3-tiny", "own"]
    factory = needle_factory(args.tool_format, args.chat_template_kwargs)
    messages = [{"role": "user", "content": QUERY}]
    tools = [{"type": "function", "function": t} for t in _tools("qwen3-tiny")]
    thinking = len(TemplateFormat(model.tokenizer).first_ids(_tools("qwen3-tiny"), QUERY))
    with ServerThread(create_app(model, workers=1, model_name="q",
                                 needle_factory=factory)) as server:
        client = server.client()
        usage = [client.chat.completions.create(model="q", messages=messages, tools=tools,
                                                max_tokens=1, extra_body=extra).usage
                 for extra in (None, {"chat_template_kwargs": {"enable_thinking": True}})]
    assert [u.prompt_tokens for u in usage] == [len(hf_reference("qwen3-tiny")["p2_ids"]),
                                                thinking]
    assert thinking != len(hf_reference("qwen3-tiny")["p2_ids"])
