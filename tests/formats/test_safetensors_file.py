"""The safetensors reader: memory-mapped F32, F16/BF16 to float32, typed errors naming the
tensor (layout: shared/fixtures/hf/README.md, "Files of a model directory")."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hf_helpers import hf_fixture_dir

from needlepoint.errors import CheckpointError, MissingTensorError, UnsupportedTensorTypeError
from needlepoint.formats.safetensors_file import SafetensorsFile


def write_raw(path, entries: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file written by hand from the spec: header length, JSON, data."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in entries.items():
        span = [offset, offset + len(data)]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": span}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_fixture_tensors_are_mapped_views_equal_to_the_library() -> None:
    from safetensors import safe_open

    path = hf_fixture_dir("llama-tiny") / "model.safetensors"
    file = SafetensorsFile(path)
    assert len(file.names()) == 39
    assert file.metadata == {"format": "pt"}
    reference = safe_open(str(path), framework="numpy")
    for name in ("model.embed_tokens.weight", "model.layers.3.mlp.down_proj.weight"):
        array = file.array(name)
        assert array.dtype == np.float32 and not array.flags.owndata  # a view of the map
        assert not array.flags.writeable
        np.testing.assert_array_equal(array, reference.get_tensor(name))
    assert file.shape("model.layers.0.self_attn.k_proj.weight") == (64, 128)


def test_f16_and_bf16_convert_to_float32(tmp_path) -> None:
    halves = np.array([1.0, -2.5, 65504.0, 2.0**-24], np.float16)
    # bfloat16 bit patterns: 1.0, -2.0, 3.140625, the largest finite value
    bf16 = np.array([0x3F80, 0xC000, 0x4049, 0x7F7F], "<u2")
    path = tmp_path / "m.safetensors"
    write_raw(path, {"h": ("F16", [2, 2], halves.tobytes()), "b": ("BF16", [4], bf16.tobytes())})
    file = SafetensorsFile(path)
    np.testing.assert_array_equal(file.array("h"), halves.astype(np.float32).reshape(2, 2))
    expected = np.array([1.0, -2.0, 3.140625, 3.3895313892515355e38], np.float32)
    np.testing.assert_array_equal(file.array("b"), expected)
    assert file.dtype("b") == "BF16"


def test_unsupported_dtype_and_missing_tensor_name_the_tensor(tmp_path) -> None:
    path = tmp_path / "m.safetensors"
    write_raw(path, {"counts": ("I32", [2], np.array([1, 2], "<i4").tobytes())})
    file = SafetensorsFile(path)
    with pytest.raises(UnsupportedTensorTypeError, match="'counts'.*I32"):
        file.array("counts")
    with pytest.raises(MissingTensorError, match="'nothing'"):
        file.array("nothing")


@pytest.mark.parametrize("blob", [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ",
                                  struct.pack("<Q", 1 << 40) + b"{}"])
def test_malformed_file_is_a_checkpoint_error(tmp_path, blob) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        SafetensorsFile(path)


def test_offsets_outside_the_file_are_rejected(tmp_path) -> None:
    path = tmp_path / "short.safetensors"
    write_raw(path, {"w": ("F32", [4], np.zeros(4, "<f4").tobytes())})
    path.write_bytes(path.read_bytes()[:-4])  # truncate the data
    with pytest.raises(CheckpointError):
        SafetensorsFile(path)
