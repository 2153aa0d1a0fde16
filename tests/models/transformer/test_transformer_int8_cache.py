"""The int8 weight cache of float checkpoints (`models/transformer/int8_cache.py`): the logits
bits are the same with the cache off, on a first load (converted, file written) and on a second
(weights mapped from the file, zero-copy); a truncated, stale or unwritable cache file is never
a wrong answer or an error. Every test points `NEEDLEPOINT_CACHE_DIR` under `tmp_path`."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hf_helpers import hf_reference, write_fixture_gguf

import needlepoint
from needlepoint.kernels import i8
from needlepoint.models.transformer import int8_cache
from needlepoint.models.transformer.linear import joined

# tied embeddings (gemma3, gpt2 with Conv1D [in, out] weights), biases (qwen2)
NAMES = ["qwen2-tiny", "gemma3-tiny", "gpt2-tiny"]


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    where = tmp_path / "cache"
    monkeypatch.setenv("NEEDLEPOINT_CACHE", "1")
    monkeypatch.setenv("NEEDLEPOINT_CACHE_DIR", str(where))
    return where


def _bits(name: str, cache: bool | None = None) -> np.ndarray:
    ref = hf_reference(name)
    model = needlepoint.load(ref.folder, numerics="int8", cache=cache)
    return model.forward(ref["p0_ids"]).view(np.uint32)


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.npi8")) if folder.exists() else []


def _root(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


@pytest.mark.parametrize("name", NAMES)
def test_same_bits_off_first_and_second_load(folder: Path, name: str) -> None:
    off = _bits(name, cache=False)
    assert not _files(folder)
    first = _bits(name)
    (written,) = _files(folder)
    stamp = written.stat().st_mtime_ns
    second = _bits(name)
    assert _files(folder) == [written] and written.stat().st_mtime_ns == stamp  # not rewritten
    np.testing.assert_array_equal(first, off)
    np.testing.assert_array_equal(second, off)


def test_gguf_float_matrices_are_cached_too(folder: Path, tmp_path: Path) -> None:
    path = write_fixture_gguf("llama-tiny", tmp_path / "llama-f16.gguf", "F16")
    ids = hf_reference("llama-tiny")["p0_ids"]
    runs = [needlepoint.load(path, numerics="int8", cache=cache).forward(ids).view(np.uint32)
            for cache in (False, True, True)]
    assert len(_files(folder)) == 1
    for run in runs[1:]:
        np.testing.assert_array_equal(run, runs[0])


def test_cached_weights_are_views_of_the_mapping(folder: Path) -> None:
    ref = hf_reference("qwen2-tiny")
    needlepoint.load(ref.folder, numerics="int8")  # writes the file
    model = needlepoint.load(ref.folder, numerics="int8")
    layer = model.weights.layers[0]
    (qkv,) = layer.qkv.parts  # q | k | v joined as one part
    base = _root(qkv.data)
    assert not qkv.data.flags.writeable and not qkv.data.flags.owndata
    for linear in (layer.o, layer.gate_up, layer.down, model.weights.lm_head):
        for part in linear.parts:
            assert _root(part.data) is base and _root(part.scale) is base
    assert qkv.n_out == layer.qkv.out_features


def test_off_switch_writes_nothing(folder: Path, monkeypatch) -> None:
    monkeypatch.setenv("NEEDLEPOINT_CACHE", "0")
    _bits("llama-tiny")
    assert not _files(folder)


@pytest.mark.parametrize("damage", ["truncated", "stale key", "index", "payload"])
def test_damaged_file_is_rebuilt_never_used(folder: Path, damage: str) -> None:
    expected = _bits("llama-tiny", cache=False)
    _bits("llama-tiny")
    (path,) = _files(folder)
    raw = bytearray(path.read_bytes())
    size = len(raw)
    if damage == "truncated":
        raw = raw[: size // 2]
    elif damage == "stale key":
        raw[12:44] = bytes(32)  # the header's key: a file made for other sources
    elif damage == "index":
        raw[int8_cache.PAGE + 10] ^= 0x20
    else:  # a byte of the first sampled page of the codes
        index = int.from_bytes(raw[44:52], "little")  # the header's index length
        page = int8_cache.PAGE
        start = page + -(-index // page) * page
        raw[start + 5] ^= 0xFF
    path.write_bytes(bytes(raw))
    np.testing.assert_array_equal(_bits("llama-tiny"), expected)
    assert _files(folder) == [path] and path.stat().st_size == size  # rewritten whole
    np.testing.assert_array_equal(_bits("llama-tiny"), expected)


def test_changed_source_makes_a_new_file(folder: Path, tmp_path: Path) -> None:
    ref = hf_reference("llama-tiny")
    copy = tmp_path / "llama-tiny"
    copy.mkdir()
    for item in Path(ref.folder).iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
    expected = needlepoint.load(copy, numerics="int8").forward(ref["p0_ids"])
    (old,) = _files(folder)
    weights = copy / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = needlepoint.load(copy, numerics="int8").forward(ref["p0_ids"])
    (new,) = _files(folder)
    assert new != old  # another key: the old file was replaced
    np.testing.assert_array_equal(again.view(np.uint32), expected.view(np.uint32))


def test_unwritable_folder_converts_in_memory(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("NEEDLEPOINT_CACHE", "1")
    monkeypatch.setenv("NEEDLEPOINT_CACHE_DIR", str(blocker / "cache"))
    np.testing.assert_array_equal(_bits("qwen2-tiny"), _bits("qwen2-tiny", cache=False))
    assert blocker.read_text() == "not a folder"


def test_joined_is_a_view_only_for_adjacent_parts() -> None:
    whole = np.arange(48, dtype=np.float32).reshape(12, 4)
    view = joined(whole[:5], whole[5:9])
    np.testing.assert_array_equal(view, whole[:9])
    assert _root(view) is _root(whole) and not view.flags.writeable
    gap = joined(whole[:5], whole[6:9])  # not adjacent: a copy
    np.testing.assert_array_equal(gap, np.concatenate([whole[:5], whole[6:9]]))
    assert gap.flags.owndata
    other = joined(whole[:2], whole[:2].copy())  # separate allocations: a copy
    assert other.flags.owndata
    assert i8.BLOCK == 32  # the cached codes are kernels.i8's blocks
