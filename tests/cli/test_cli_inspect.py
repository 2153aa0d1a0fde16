"""`needlepoint inspect`: the JSON agrees with every fixture's sidecar, the tables print, and
user errors are one line on stderr with exit status 2."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import NEEDLE2_FIXTURES, NEEDLE3_FIXTURES, get_fixture, toy_model_path

from needlepoint.cli.main import COMMANDS, main

ALL_FIXTURES = [("needle3", name) for name in NEEDLE3_FIXTURES] + [
    ("needle2", name) for name in NEEDLE2_FIXTURES
]
# Sidecar geometry keys that our config spells differently.
RENAMED = {"vocab_size": "vocab", "engram_layers": "engram_sites"}
# needle3 sidecar `config` keys that are header fields (the rest are training settings;
# `kv_window` there is the requested one, 0 = default: the header's effective value is in the
# sidecar `header`, which is checked too).
V3_CONFIG_KEYS = (
    "vocab_size", "d_model", "num_heads", "num_kv_heads", "num_layers", "qk_head_dim",
    "v_head_dim", "max_seq_len", "rope_theta", "engram_orders", "engram_slots",
    "engram_seed_heads", "engram_layers", "global_layers", "sliding_window", "mhc_lanes",
    "qkv_conv_taps", "out_vocab", "kv_bits",
)


def inspect_json(path: Path, capsys) -> dict:
    assert main(["inspect", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


def check_tensor_table(tensors: list[dict], directory: list[dict]) -> None:
    assert [t["name"] for t in tensors] == [entry["name"] for entry in directory]
    for tensor, entry in zip(tensors, directory, strict=True):
        name = entry["name"]
        assert tensor["dtype"] == entry["dtype"].lower(), name
        assert tensor["shape"] == entry["shape"], name
        assert tensor["nbytes"] == entry["nbytes"], name
        assert tensor["offset"] == entry["offset"], name
        if tensor["dtype"] == "cq":
            assert (tensor["bits"], tensor["group"]) == (entry["bits"], entry["group"]), name
        else:
            assert tensor["bits"] == {"fp16": 16, "fp32": 32, "raw": None}[tensor["dtype"]]
            assert entry["bits"] in (0, None) and tensor["group"] is None, name


@pytest.mark.parametrize("generation,name", ALL_FIXTURES)
def test_json_matches_sidecar(generation: str, name: str, capsys) -> None:
    fixture = get_fixture(generation, name)
    summary = inspect_json(fixture.cact, capsys)
    meta = fixture.meta
    geometry = summary["geometry"]
    assert summary["generation"] == int(generation[-1])
    assert summary["file_bytes"] == fixture.cact.stat().st_size
    for key, value in meta["header"].items():
        if key == "tag":
            assert int(summary["tag"], 16) == int(value, 16)
        else:
            assert geometry[RENAMED.get(key, key)] == value, key
    if generation == "needle3":
        for key in V3_CONFIG_KEYS:
            assert geometry[RENAMED.get(key, key)] == meta["config"][key], key
        directory = meta["directory"]
        assert summary["tokenizer"]["vocab_size"] == meta["tokenizer"]["pieces"]
        assert summary["heads"] == ["confidence_head"]
    else:
        assert geometry["codebook_len"] == meta["codebook_len"]
        directory = meta["archive"]["tensors"]
        assert summary["file_bytes"] == meta["archive"]["bytes"]
        assert summary["tokenizer"]["vocab_size"] == meta["header"]["vocab_size"]
        assert summary["heads"] == ["contrastive_head", "confidence_head"]
    assert geometry["num_tensors"] == len(directory) == len(summary["tensors"])
    check_tensor_table(summary["tensors"], directory)
    assert summary["totals"]["cq_bits"] == [2, 4]


def test_toy_model_json(capsys) -> None:
    summary = inspect_json(toy_model_path(), capsys)
    geometry = summary["geometry"]
    # Facts from shared/models/README.md.
    assert summary["generation"] == 3 and summary["file_bytes"] == 300_657
    assert (geometry["vocab"], geometry["d_model"], geometry["num_layers"]) == (1024, 128, 4)
    assert (geometry["num_heads"], geometry["num_kv_heads"]) == (4, 2)
    assert (geometry["qk_head_dim"], geometry["v_head_dim"]) == (32, 32)
    assert geometry["global_layers"] == [1, 3] and geometry["sliding_window"] == 64
    assert geometry["engram_sites"] == [1] and geometry["engram_slots"] == 1021
    assert geometry["kv_window"] == 512 and geometry["rope_theta"] == 100000.0
    assert summary["totals"]["parameters"] == 626_032
    assert summary["tokenizer"]["vocab_size"] == 1024
    assert summary["heads"] == []
    assert summary["tensors"][-1]["name"] == "tokenizer"


def test_bundled_model_inspects(capsys) -> None:
    bundled = Path(__file__).resolve().parents[2] / "src/needlepoint/data/needle3-toy.cact"
    assert bundled.read_bytes() == toy_model_path().read_bytes()
    summary = inspect_json(bundled, capsys)
    assert summary["totals"]["parameters"] == 626_032


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_pretty_output(generation: str, capsys) -> None:
    path = get_fixture(generation, "tiny").cact
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    number = generation[-1]
    assert f"Needle {number} archive" in out
    for text in ("Geometry", "d_model", "Tensors", "embedding", "layer03.out_proj",
                 "tokenizer:", "heads: ", "confidence_head", "final_norm"):
        assert text in out, text
    assert "[64, 96]" in out or "[96, 96]" in out


def test_tokenizer_size_falls_back_to_blob_header(monkeypatch, capsys) -> None:
    """Without the tokenizer module, the size is the blob header's n_pieces."""
    from needlepoint.cli.inspect import role
    from needlepoint.formats.cact import CactArchive

    def no_tokenizer_module(archive):
        raise ImportError("no module named needlepoint.tokenizer")

    monkeypatch.setattr(CactArchive, "tokenizer", property(no_tokenizer_module))
    summary = inspect_json(get_fixture("needle3", "tiny").cact, capsys)
    assert summary["tokenizer"] == {
        "vocab_size": 1024, "source": "blob header n_pieces",
        "nbytes": summary["tensors"][-1]["nbytes"],
    }
    assert role("layer02.w3b") == "Hadamard MLP"


# -- errors ------------------------------------------------------------------------------------
def assert_one_line_error(capsys, *needles: str) -> None:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("needlepoint: error: ")
    assert "Traceback" not in captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_file(tmp_path, capsys) -> None:
    assert main(["inspect", str(tmp_path / "nope.cact")]) == 2
    assert_one_line_error(capsys, "nope.cact")


def test_directory(tmp_path, capsys) -> None:
    assert main(["inspect", str(tmp_path), "--json"]) == 2
    assert_one_line_error(capsys, "directory")


def test_empty_file(tmp_path, capsys) -> None:
    path = tmp_path / "empty.cact"
    path.write_bytes(b"")
    assert main(["inspect", str(path)]) == 2
    assert_one_line_error(capsys, "empty", "byte offset 0")


def test_corrupt_archive(tmp_path, capsys) -> None:
    data = bytearray(get_fixture("needle2", "tiny").cact.read_bytes())
    path = tmp_path / "corrupt.cact"
    path.write_bytes(bytes(data[:5000]))
    assert main(["inspect", str(path)]) == 2
    assert_one_line_error(capsys, "corrupt.cact", "truncated", "byte offset")
    struct.pack_into("<I", data, 0, 0xDEADBEEF)
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path), "--json"]) == 2
    assert_one_line_error(capsys, "header.tag", "byte offset 0")


def test_corrupt_tokenizer_blob(tmp_path, capsys) -> None:
    fixture = get_fixture("needle3", "tiny")
    data = bytearray(fixture.cact.read_bytes())
    tokenizer = fixture.meta["directory"][-1]
    struct.pack_into("<I", data, tokenizer["offset"], 0)
    path = tmp_path / "badtok.cact"
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 2
    assert_one_line_error(capsys, "(tokenizer)", f"byte offset {tokenizer['offset']}")


def test_usage_errors(capsys) -> None:
    for argv in ([], ["inspect"], ["frobnicate"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert "usage:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert "needlepoint" in capsys.readouterr().out
    assert "inspect" in COMMANDS


def _console_script() -> str:
    found = shutil.which("needlepoint") or shutil.which(
        "needlepoint", path=sysconfig.get_path("scripts")
    )
    if found is None:
        pytest.fail("the `needlepoint` console script is not installed (pip install -e .)")
    return found


def test_console_script_end_to_end(tmp_path) -> None:
    """The installed entry point, in a real process: JSON on stdout; errors exit 2."""
    script = _console_script()
    toy = toy_model_path()
    done = subprocess.run(
        [script, "inspect", str(toy), "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["geometry"]["d_model"] == 128
    pretty = subprocess.run([script, "inspect", str(toy)], capture_output=True, text=True,
                            timeout=60)
    assert pretty.returncode == 0 and "tokenizer: 1,024 pieces" in pretty.stdout
    bad = subprocess.run(
        [script, "inspect", str(tmp_path / "missing.cact")], capture_output=True, text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_module_entry_point_matches(tmp_path) -> None:
    code = "import sys; from needlepoint.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "inspect", str(get_fixture("needle2", "tiny").cact),
         "--json"], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["generation"] == 2
