"""A malformed GGUF file is a `GGUFFormatError` naming the tensor and the byte offset, at open
and through `needlepoint.load`: a truncated payload, an unknown ggml type, a byte size that
disagrees with the type and shape, a shape that does not divide into blocks."""

from __future__ import annotations

import struct

import pytest
from hf_helpers import write_fixture_gguf

import needlepoint
from needlepoint.errors import CheckpointError, GGUFFormatError
from needlepoint.formats.gguf_reader import GGUFFile

TENSOR = "blk.0.attn_q.weight"


def _entry(data: bytes, name: str) -> int:
    """Byte offset of the n_dims field of `name`'s directory entry."""
    encoded = name.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded)
    return at + 8 + len(encoded)


def _patched(data: bytes, name: str, *, dim0: int | None = None, dim1: int | None = None,
             kind: int | None = None) -> bytes:
    out = bytearray(data)
    at = _entry(data, name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    if dim0 is not None:
        struct.pack_into("<Q", out, at + 4, dim0)
    if dim1 is not None:
        struct.pack_into("<Q", out, at + 12, dim1)
    if kind is not None:
        struct.pack_into("<I", out, at + 4 + 8 * n_dims, kind)
    return bytes(out)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    folder = tmp_path_factory.mktemp("bad_gguf")
    return write_fixture_gguf("llama-tiny", folder / "good.gguf", "Q8_0").read_bytes()


def _fails(tmp_path, data: bytes, label: str) -> GGUFFormatError:
    path = tmp_path / f"{label}.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFFormatError) as caught:
        GGUFFile(path)
    with pytest.raises(GGUFFormatError) as loaded:
        needlepoint.load(path, numerics="int8")
    assert str(loaded.value) == str(caught.value)
    assert str(path) in str(caught.value)
    assert "GGUFTensor(" not in str(caught.value) and "<" not in str(caught.value)
    return caught.value


def test_truncated_payload_names_a_tensor_past_the_end(good, tmp_path) -> None:
    error = _fails(tmp_path, good[: len(good) - 4096], "truncated")
    assert error.tensor is not None and error.tensor in str(error)
    assert f"byte {error.offset}" in str(error) and "past the end" in str(error)
    assert error.offset + 1 <= len(good)


def test_unknown_type(good, tmp_path) -> None:
    error = _fails(tmp_path, _patched(good, TENSOR, kind=99), "unknown")
    assert error.tensor == TENSOR and "unknown ggml type 99" in str(error)
    assert error.offset == _entry(good, TENSOR) - 8 - len(TENSOR)


def test_byte_size_disagreeing_with_type_and_shape(good, tmp_path) -> None:
    at = _entry(good, TENSOR)
    rows = struct.unpack_from("<Q", good, at + 12)[0]
    error = _fails(tmp_path, _patched(good, TENSOR, dim1=rows + 1), "size")
    assert error.tensor == TENSOR and "disagrees with its type and shape" in str(error)
    assert f"byte {error.offset}" in str(error)


def test_shape_not_whole_blocks(good, tmp_path) -> None:
    error = _fails(tmp_path, _patched(good, TENSOR, dim0=33), "blocks")
    assert error.tensor == TENSOR and "whole Q8_0 blocks of 32" in str(error)


def test_header_faults_are_typed(good, tmp_path) -> None:
    for label, data in {"magic": b"GGML" + good[4:], "directory": good[:200]}.items():
        path = tmp_path / f"{label}.gguf"
        path.write_bytes(data)
        with pytest.raises(GGUFFormatError) as caught:
            GGUFFile(path)
        assert isinstance(caught.value, CheckpointError) and caught.value.tensor is None
