"""The `.cact` reader on good archives: every fixture reads back as its sidecar says
(directory, header, config, heads, tokenizer, codebooks), whatever the source (path, str,
bytes). Shared setup: `cact_helpers.py`."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from cact_helpers import ALL_FIXTURES, sidecar_directory
from conftest import get_fixture, toy_model_path

from needlepoint import open_archive
from needlepoint.formats.cact import CQTensor
from needlepoint.formats.needle2_geometry import V2Config
from needlepoint.formats.needle3_geometry import V3Config


# -- good archives ------------------------------------------------------------------------------
@pytest.mark.parametrize("generation,name", ALL_FIXTURES)
def test_directory_matches_sidecar(generation: str, name: str) -> None:
    fixture = get_fixture(generation, name)
    archive = open_archive(fixture.cact)
    expected = sidecar_directory(fixture)
    assert archive.names == [entry["name"] for entry in expected]
    assert archive.generation == int(generation[-1])
    assert archive.size == fixture.cact.stat().st_size
    for record, entry in zip(archive.records, expected, strict=True):
        assert record.dtype == entry["dtype"].lower(), record.name
        assert list(record.shape) == entry["shape"], record.name
        assert record.offset == entry["offset"], record.name
        assert record.nbytes == entry["nbytes"], record.name
        if record.dtype == "cq":
            assert (record.bits, record.group) == (entry["bits"], entry["group"]), record.name
            cq = archive.cq(record.name)
            assert cq.nbytes == record.nbytes
            if "packed_bytes" in entry:
                assert cq.packed.nbytes == entry["packed_bytes"]
                assert cq.norms.nbytes == entry["norm_bytes"]


@pytest.mark.parametrize("generation,name", ALL_FIXTURES)
def test_header_matches_sidecar(generation: str, name: str) -> None:
    fixture = get_fixture(generation, name)
    archive = open_archive(fixture.cact)
    cfg = archive.config
    header = fixture.meta["header"]
    renamed = {"vocab_size": "vocab", "engram_layers": "engram_sites"}
    for key, value in header.items():
        if key == "tag":
            assert int(value, 16) == (0x05E12A84 if generation == "needle3" else 0x05E12A83)
            continue
        got = getattr(cfg, renamed.get(key, key))
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    if generation == "needle3":
        config = fixture.meta["config"]
        for key in ("vocab_size", "d_model", "num_heads", "num_kv_heads", "num_layers",
                    "qk_head_dim", "v_head_dim", "max_seq_len", "rope_theta", "mhc_lanes",
                    "engram_orders", "engram_slots", "engram_layers", "global_layers",
                    "sliding_window", "qkv_conv_taps", "out_vocab", "kv_bits"):
            got = getattr(cfg, renamed.get(key, key))
            assert (list(got) if isinstance(got, tuple) else got) == config[key], key
        assert isinstance(cfg, V3Config)
    else:
        assert isinstance(cfg, V2Config)
        assert cfg.codebook_len == fixture.meta["codebook_len"]


def test_config_is_frozen() -> None:
    archive = open_archive(get_fixture("needle3", "tiny").cact)
    with pytest.raises(dataclasses.FrozenInstanceError):
        archive.config.d_model = 1  # type: ignore[misc]
    assert hash(archive.config) == hash(dataclasses.replace(archive.config))


@pytest.mark.parametrize("generation,name", ALL_FIXTURES)
def test_heads_and_tokenizer(generation: str, name: str) -> None:
    fixture = get_fixture(generation, name)
    archive = open_archive(fixture.cact)
    if generation == "needle3":
        assert archive.heads == ("confidence_head",)
        assert archive.tokenizer.vocab_size == fixture.meta["tokenizer"]["pieces"]
    else:
        assert archive.heads == ("contrastive_head", "confidence_head")
        assert archive.tokenizer.vocab_size == archive.config.vocab
    blob = archive.tokenizer_blob
    assert struct.unpack_from("<I", blob, 0)[0] == archive.tokenizer.vocab_size
    assert len(blob) == archive.records[-1].nbytes


def test_toy_model_and_bundled_copy() -> None:
    from importlib.resources import files

    archive = open_archive(toy_model_path())
    assert archive.generation == 3 and archive.heads == ()
    assert archive.config.global_layers == (1, 3) and archive.config.engram_sites == (1,)
    bundled = files("needlepoint") / "data" / "needle3-toy.cact"
    assert bundled.read_bytes() == toy_model_path().read_bytes()


def test_codebooks() -> None:
    archive = open_archive(get_fixture("needle3", "tiny").cact)
    books = archive.codebooks
    assert {bits: len(book) for bits, book in books.items()} == {1: 2, 2: 4, 3: 8, 4: 16, 5: 4}
    for bits in (2, 3, 4):
        assert np.all(np.diff(books[bits]) > 0)
    np.testing.assert_allclose(
        books[2] * np.sqrt(128), [-1.50667, -0.45144, 0.45295, 1.50993], atol=1e-5
    )
    c = 1.2240064 / np.sqrt(128)
    np.testing.assert_allclose(books[5], [0, c, 0, -c], rtol=1e-6)  # code 3 = -c, 1 = +c


def test_path_str_path_and_bytes_agree(tmp_path) -> None:
    path = get_fixture("needle2", "tiny").cact
    by_path, by_str, by_bytes = open_archive(path), open_archive(str(path)), open_archive(
        path.read_bytes()
    )
    for other in (by_str, by_bytes):
        assert other.records == by_path.records and other.config == by_path.config
    np.testing.assert_array_equal(by_bytes.floats("embedding"), by_path.floats("embedding"))
    assert "tiny.cact" in repr(by_path)


def test_access_errors() -> None:
    archive = open_archive(get_fixture("needle3", "tiny").cact)
    assert archive.has("layer00.q_proj") and not archive.has("nope")
    with pytest.raises(KeyError):
        archive.record("nope")
    with pytest.raises(TypeError):
        archive.array("layer00.q_proj")
    with pytest.raises(TypeError):
        archive.cq("final_norm")
    assert isinstance(archive.cq("layer00.q_proj"), CQTensor)
    assert archive.array("final_norm").dtype == np.float16

