"""The CLI on the files users bring (GGUF files, Hugging Face directories, base models):
`inspect` reads them, `run --raw` continues plain text on a base model, a base model asked to
chat names the file and what to do, and the refusal note is only for Needle's wire format."""

from __future__ import annotations

import json
import math

import numpy as np
from conftest import toy_model_path
from gguf_family_helpers import write_family_gguf
from hf_helpers import hf_fixture_dir

import needlepoint
from needlepoint.cli.main import main


def reference_meta(name: str) -> dict:
    return json.loads((hf_fixture_dir(name) / "reference.json").read_text())


def test_inspect_a_gguf_file(tmp_path, capsys):
    path = write_family_gguf("gemma3-tiny", tmp_path / "gemma3-tiny.gguf", "Q8_0")
    assert main(["inspect", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    config = json.loads((hf_fixture_dir("gemma3-tiny") / "config.json").read_text())
    assert summary["format"] == "gguf" and summary["architecture"] == "gemma3"
    geometry = summary["geometry"]
    assert (geometry["d_model"], geometry["num_layers"], geometry["num_heads"]) == (
        config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"])
    assert summary["context"] == config["max_position_embeddings"]
    tensors = reference_meta("gemma3-tiny")["safetensors_tensors"]
    assert summary["parameters"] == sum(math.prod(t["shape"]) for t in tensors.values())
    assert set(summary["tensor_types"]) == {"F32", "Q8_0"}  # 1-D tensors stay F32
    assert summary["bytes"] == path.stat().st_size
    assert summary["chat_template"] is True and summary["call_syntax"]["open"]
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "Q8_0" in text and "gemma3_text" in text and "tool calls:" in text


def test_inspect_a_hugging_face_directory(capsys):
    folder = hf_fixture_dir("qwen2-tiny")
    assert main(["inspect", str(folder), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    tensors = reference_meta("qwen2-tiny")["safetensors_tensors"]
    assert summary["format"] == "safetensors" and summary["architecture"] == "qwen2"
    assert summary["tensor_types"] == {"F32": {
        "tensors": len(tensors), "parameters": sum(math.prod(t["shape"])
                                                   for t in tensors.values())}}
    assert summary["call_syntax"]["open"] == "<tool_call>"
    assert summary["call_syntax"]["body"] == "object"


def test_a_base_model_continues_text_with_raw(capsys):
    folder = hf_fixture_dir("gpt2-tiny")  # no chat template
    assert main(["inspect", str(folder), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["chat_template"] is False and summary["call_syntax"] is None
    assert main(["run", "--raw", "The quick brown", "--model", str(folder),
                 "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    model = needlepoint.load(folder)
    session = model.session()
    ids = model.tokenizer.encode("The quick brown")
    logits, greedy = session.prefill(ids), []
    for _ in range(6):
        greedy.append(int(np.argmax(logits)))
        logits = session.step(greedy[-1])
    if model.tokenizer.eos_id in greedy:
        greedy = greedy[: greedy.index(model.tokenizer.eos_id)]
    expected = b"".join(model.tokenizer.all_token_bytes()[t] for t in greedy)
    assert out == "The quick brown" + expected.decode("utf-8", "replace") + "\n"


def test_a_base_model_asked_to_chat_names_the_file_and_what_to_do(capsys):
    folder = hf_fixture_dir("gpt2-tiny")
    assert main(["run", "hello", "--model", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no chat template" in err and "--raw" in err and "tokenizer" in err
    assert "HFTokenizer(" not in err and "vocab_size=" not in err


def test_the_refusal_note_is_only_for_the_wire_format(capsys):
    assert main(["run", "hello", "--model", str(hf_fixture_dir("qwen2-tiny")),
                 "--max-new-tokens", "4"]) == 0
    assert "refusal" not in capsys.readouterr().err
    assert main(["run", "hello", "--model", str(toy_model_path()),
                 "--max-new-tokens", "4"]) == 0
    assert "immediate refusal" in capsys.readouterr().err
