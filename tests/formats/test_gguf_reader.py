"""`formats.gguf_reader.GGUFFile` reads what the `gguf` package's GGUFReader reads: every
metadata value, every tensor's name, type, shape and bytes; on fixture re-packs of every
block type and on the real SmolLM2 file; malformed files are ValueErrors."""

from __future__ import annotations

import numpy as np
import pytest
from hf_helpers import SmolLM2Reference, write_fixture_gguf

from needlepoint.formats.gguf_checkpoint import field_value
from needlepoint.formats.gguf_reader import GGUFFile


def _same_as_gguf(path) -> int:
    import gguf

    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path), "r")
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}  # header
    assert list(ours.values) == list(fields)
    for key, field in fields.items():
        assert ours.values[key] == field_value(field), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, other in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == other.tensor_type, mine.name
        assert mine.shape.tolist() == other.shape.tolist(), mine.name
        assert mine.data.shape == other.data.shape and mine.data.dtype == other.data.dtype
        assert mine.data.tobytes() == other.data.tobytes(), mine.name
    return len(ours.tensors)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_1", "Q5_0", "Q5_1"])
def test_fixture_repacks_read_as_gguf_reads_them(qtype, tmp_path) -> None:
    name = "gpt2-tiny" if qtype in ("F16", "Q5_0", "BF16") else "llama-tiny"
    assert _same_as_gguf(write_fixture_gguf(name, tmp_path / f"{qtype}.gguf", qtype)) > 30


def test_smollm2_reads_as_gguf_reads_it() -> None:
    assert _same_as_gguf(SmolLM2Reference().path) == 272


def test_malformed_files(tmp_path) -> None:
    good = write_fixture_gguf("llama-tiny", tmp_path / "good.gguf").read_bytes()
    cases = {"magic": b"GGML" + good[4:], "version": good[:4] + b"\x07\x00\x00\x00" + good[8:],
             "big-endian": good[:4] + b"\x00\x00\x00\x03" + good[8:],
             "truncated": good[:2000], "no tensors' data": good[: len(good) // 2]}
    for label, data in cases.items():
        path = tmp_path / f"{label}.gguf"
        path.write_bytes(data)
        with pytest.raises(ValueError):
            GGUFFile(path)
    assert np.array_equal(np.frombuffer(good[:4], np.uint8), np.frombuffer(b"GGUF", np.uint8))
