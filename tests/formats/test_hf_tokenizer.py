"""Hugging Face tokenizers and chat templates against the fixtures (ids made by transformers;
shared/fixtures/hf/README.md, "tokenizer.json elements used", "Chat template")."""

from __future__ import annotations

import json

import pytest
from hf_helpers import HF_FIXTURES, hf_fixture_dir, hf_reference

from needlepoint.errors import TokenizerError
from needlepoint.formats.chat_template import render_chat_template
from needlepoint.formats.hf_tokenizer import HFTokenizer
from needlepoint.formats.tokenizer import PieceType


@pytest.fixture(scope="module", params=HF_FIXTURES)
def fixture_tokenizer(request):
    return request.param, HFTokenizer.from_directory(hf_fixture_dir(request.param))


def test_prompt_ids_match_transformers(fixture_tokenizer) -> None:
    name, tokenizer = fixture_tokenizer
    ref = hf_reference(name)
    for prompt in ref.prompts:
        assert tokenizer.encode(prompt["text"]) == ref[f"p{prompt['index']}_ids"].tolist(), \
            prompt["kind"]


def test_token_bytes_spell_the_text(fixture_tokenizer) -> None:
    name, tokenizer = fixture_tokenizer
    ref = hf_reference(name)
    special = [m for m, i in tokenizer.markers.items() if tokenizer.types[i] == PieceType.CONTROL]
    for prompt in ref.prompts:
        expected = prompt["text"]
        for marker in special:  # special tokens contribute no bytes
            expected = expected.replace(marker, "")
        text = tokenizer.decode_bytes(ref[f"p{prompt['index']}_ids"].tolist()).decode("utf-8")
        starts_plain = expected and not expected.startswith(" ") and prompt["text"][:2] != "<|"
        if tokenizer.byte_mode == "metaspace" and starts_plain:
            expected = " " + expected  # Metaspace's prefix "▁" (unless one is there already)
        assert text == expected, prompt["kind"]


def test_special_ids_types_and_markers() -> None:
    llama = HFTokenizer.from_directory(hf_fixture_dir("llama-tiny"))
    assert (llama.bos_id, llama.eos_id, llama.vocab_size) == (1, 2, 1004)
    assert llama.encode("") == [1]
    assert llama.marker_id("<|im_end|>") == 1001 and llama.marker_id("<tool_call>") == 1002
    assert llama.types[1001] == PieceType.CONTROL and llama.token_bytes(1001) == b""
    assert llama.types[1002] == PieceType.USER_DEFINED
    assert llama.token_bytes(1002) == b"<tool_call>"
    assert llama.types[3 + 0x41] == PieceType.BYTE and llama.token_bytes(3 + 0x41) == b"A"
    assert llama.id_to_piece(1) == "<s>" and llama.piece_to_id("<0x0A>") == 3 + 0x0A
    gpt2 = HFTokenizer.from_directory(hf_fixture_dir("gpt2-tiny"))
    assert (gpt2.bos_id, gpt2.eos_id) == (0, 0)
    assert gpt2.decode(gpt2.encode("Hello, world!")) == "Hello, world!"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        gpt2.decode([5000])
    with pytest.raises(KeyError):
        gpt2.marker_id("<tool_call>")


def test_chat_template_renders_like_transformers() -> None:
    folder = hf_fixture_dir("llama-tiny")
    tokenizer = HFTokenizer.from_directory(folder)
    example = json.loads((folder / "chat_example.json").read_text())
    rendered = tokenizer.apply_chat_template(example["messages"], tools=example["tools"],
                                             add_generation_prompt=True)
    assert rendered == example["rendered"]
    assert rendered == (folder / "chat_example.txt").read_text()
    assert tokenizer.encode(rendered) == example["ids"]
    chat = json.loads((folder.parent / "specs_shared.json").read_text())["models"][0]["chat"]
    ids = tokenizer.encode_chat(chat["messages"], tools=chat["tools"])
    assert ids == hf_reference("llama-tiny")["p2_ids"].tolist()


def test_template_environment_matches_transformers() -> None:
    # tojson keeps key order, does not escape HTML or non-ASCII; trim_blocks; raise_exception
    source = ("{% for m in messages %}{{ m | tojson }}\n{% endfor %}"
              "{% if tools is none %}{{ raise_exception('no tools: ' + bos_token) }}{% endif %}")
    text = render_chat_template(source, [{"z": "<é>", "a": 1}], tools=[],
                                special_tokens={"bos_token": "<s>"})
    assert text == '{"z": "<é>", "a": 1}\n'
    with pytest.raises(TokenizerError, match="no tools: <s>"):
        render_chat_template(source, [], special_tokens={"bos_token": "<s>"})
    with pytest.raises(TokenizerError, match="does not parse"):
        render_chat_template("{% for %}", [])
    gpt2 = HFTokenizer.from_directory(hf_fixture_dir("gpt2-tiny"))
    with pytest.raises(TokenizerError, match="no chat template"):
        gpt2.apply_chat_template([{"role": "user", "content": "hi"}])


def test_broken_tokenizer_files_are_tokenizer_errors(tmp_path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        HFTokenizer.from_directory(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        HFTokenizer.from_directory(tmp_path)
