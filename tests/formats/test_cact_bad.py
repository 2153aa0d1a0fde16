"""The `.cact` reader on bad input, one explicit test per kind: every one is a
`CactFormatError` naming the field and byte offset (never an IndexError, a MemoryError, a
hang or a silently wrong tensor). Mutated copies go to pytest's tmp_path or straight to
`open_archive` as bytes. Shared setup: `cact_helpers.py`."""

from __future__ import annotations

import hashlib
import time

import pytest
from cact_helpers import (
    directory_start,
    expect_error,
    mutate,
    record_at,
    tiny_bytes,
    touch_everything,
)
from conftest import get_fixture

from needlepoint import CactFormatError, open_archive
from needlepoint.formats.cact import RECORD_BYTES


# -- bad archives: one explicit test per kind -------------------------------------------------
def test_empty_file(tmp_path) -> None:
    path = tmp_path / "empty.cact"
    path.write_bytes(b"")
    for source in (path, b""):
        with pytest.raises(CactFormatError, match=r"header\.tag \(byte offset 0\).*empty"):
            open_archive(source)


def test_directory_is_not_an_archive(tmp_path) -> None:
    with pytest.raises(CactFormatError, match="directory"):
        open_archive(tmp_path)


def test_missing_file_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        open_archive(tmp_path / "missing.cact")


def test_not_an_archive(tmp_path) -> None:
    expect_error(b"hello world, not a model", "header.tag", 0, tmp_path=tmp_path)
    expect_error(b"\x84", "header.tag", 0)


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_unknown_tag(generation: str, tmp_path) -> None:
    data = mutate(tiny_bytes(generation), 0, "<I", 0x05E12A85)
    message = expect_error(data, "header.tag", 0, tmp_path=tmp_path)
    assert "0x05E12A85" in message


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_truncated_everywhere(generation: str, tmp_path) -> None:
    data = tiny_bytes(generation)
    archive = open_archive(data)
    dir_start = directory_start(archive)
    data_start = dir_start + RECORD_BYTES * len(archive.records)
    cases = {
        2: "header.tag",
        archive.header_bytes - 1: "header",
        archive.header_bytes + 5: "codebooks",
        dir_start + 10: "directory",
        data_start - 1: "directory",
        data_start + 100: "directory[0] (embedding).nbytes",
        len(data) - 1: "(tokenizer).nbytes",
    }
    for length, field in cases.items():
        message = expect_error(data[:length], field, tmp_path=tmp_path)
        assert "truncated" in message, message


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_record_pointing_outside_the_file(generation: str) -> None:
    data = tiny_bytes(generation)
    archive = open_archive(data)
    where = record_at(archive, "layer00.q_proj")
    beyond = mutate(data, where + 20, "<Q", len(data) + 64)
    expect_error(beyond, "directory[2] (layer00.q_proj).offset", where + 20)
    huge = mutate(data, where + 20, "<Q", 2**64 - 64)
    expect_error(huge, "directory[2] (layer00.q_proj).offset", where + 20)
    into_header = mutate(data, where + 20, "<Q", 0)
    expect_error(into_header, "directory[2] (layer00.q_proj).offset", where + 20)
    huge_size = mutate(data, where + 28, "<Q", 2**63)
    expect_error(huge_size, "directory[2] (layer00.q_proj)", where + 28)


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_overlapping_and_unaligned_blobs(generation: str) -> None:
    data = tiny_bytes(generation)
    archive = open_archive(data)
    q, k = archive.record("layer00.q_proj"), archive.record("layer00.k_proj")
    # A same-sized blob pointed at another tensor would decode silently as the wrong weights.
    onto = mutate(data, record_at(archive, "layer00.k_proj") + 20, "<Q", q.offset)
    assert k.nbytes <= q.nbytes
    message = expect_error(onto, ".offset")
    assert "overlaps" in message
    unaligned = mutate(data, record_at(archive, "layer00.k_proj") + 20, "<Q", k.offset + 2)
    expect_error(unaligned, "directory[3] (layer00.k_proj).offset")


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_size_mismatch(generation: str, tmp_path) -> None:
    data = tiny_bytes(generation)
    archive = open_archive(data)
    where = record_at(archive, "layer00.q_proj")
    record = archive.record("layer00.q_proj")
    shrunk = mutate(data, where + 28, "<Q", record.nbytes - 64)
    expect_error(shrunk, "directory[2] (layer00.q_proj).nbytes", where + 28, tmp_path=tmp_path)
    # The shape disagrees with the header geometry.
    reshaped = mutate(data, where + 4, "<I", record.shape[0] * 2)
    message = expect_error(reshaped, "directory[2] (layer00.q_proj).shape", where + 4)
    assert "geometry" in message
    # An FP16 vector whose byte count disagrees with its shape.
    norm = record_at(archive, "layer00.norm_in")
    expect_error(mutate(data, norm + 28, "<Q", 190), "(layer00.norm_in).nbytes", norm + 28)
    # Geometry that disagrees with the directory: one more layer than records exist for.
    layers = 40 if generation == "needle3" else 36
    expect_error(mutate(data, layers, "<I", archive.config.num_layers + 1), "header.num_tensors")


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_bad_record_fields(generation: str) -> None:
    data = tiny_bytes(generation)
    archive = open_archive(data)
    where = record_at(archive, "layer00.q_proj")
    expect_error(mutate(data, where, "<B", 9), "(layer00.q_proj).dtype", where)
    expect_error(mutate(data, where, "<B", 4), "(layer00.q_proj).dtype", where)
    expect_error(mutate(data, where + 1, "<B", 7), "(layer00.q_proj).ndim", where + 1)
    expect_error(mutate(data, where + 40, "<I", 6), "(layer00.q_proj).bits", where + 40)
    for group in (0, 2, 96, 8192):
        expect_error(mutate(data, where + 36, "<I", group), "(layer00.q_proj).group", where + 36)
    zero_dim = mutate(data, where + 4, "<I", 0)
    expect_error(zero_dim, "(layer00.q_proj).shape", where + 4)
    tokenizer = directory_start(archive) + (len(archive.records) - 1) * RECORD_BYTES
    expect_error(mutate(data, tokenizer, "<B", 1), "(tokenizer).dtype", tokenizer)


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_bad_header_fields(generation: str) -> None:
    data = tiny_bytes(generation)
    v3 = generation == "needle3"
    word = {  # header word index of each field
        "num_tensors": 1, "codebook_len": 2, "vocab": 5, "d_model": 7 if v3 else 6,
        "num_kv_heads": 9 if v3 else 8, "num_layers": 10 if v3 else 9,
        "hada_n": 14 if v3 else 12, "num_engram_orders": 26 if v3 else 19,
        "engram_orders": 27 if v3 else 20, "num_engram_sites": 31 if v3 else 24,
        "engram_sites": 32 if v3 else 25,
    }
    rope = 192 if v3 else 116
    cases = [
        ("num_tensors", 0), ("num_tensors", 1 << 20), ("codebook_len", 27), ("vocab", 0),
        ("vocab", 1 << 30), ("d_model", 0), ("num_kv_heads", 3), ("num_layers", 0),
        ("num_layers", 1 << 20), ("num_layers", 1 << 24), ("hada_n", 100), ("hada_n", 64),
        ("num_engram_orders", 9), ("num_engram_sites", 200), ("engram_orders", 0),
        ("engram_orders", 1 << 30), ("engram_sites", 99),
    ]
    for field, value in cases:
        started = time.perf_counter()
        message = expect_error(mutate(data, 4 * word[field], "<I", value), "header.")
        assert time.perf_counter() - started < 1.0, (field, value)  # no layout of 2^20 layers
        assert f"header.{field}" in message, message
    message = expect_error(mutate(data, 4 * word["vocab"], "<I", 0), "header.vocab")
    assert f"(byte offset {4 * word['vocab']})" in message
    for theta in (float("nan"), float("inf"), 0.0, -1.0):
        expect_error(mutate(data, rope, "<f", theta), "header.rope_theta", rope)
    # Engram sites must ascend: swap the two sites of tiny (layers 1, 3).
    sites = 4 * word["engram_sites"]
    expect_error(mutate(data, sites, "<2I", 3, 1), "header.engram_sites", sites)
    if v3:
        expect_error(mutate(data, 68, "<I", 1 << 9), "header.global_layers", 68)
        expect_error(mutate(data, 24, "<I", 5000), "header.out_vocab", 24)
        expect_error(mutate(data, 76, "<I", 1000), "header.qkv_conv_taps", 76)


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_bad_head_manifest(generation: str) -> None:
    data = tiny_bytes(generation)
    archive = open_archive(data)
    manifest = archive.record("heads.manifest")
    where = record_at(archive, "heads.manifest")
    codes = archive.array("heads.manifest")
    # Unknown head code.
    message = expect_error(
        mutate(data, manifest.offset, "<e", 7.0), "heads.manifest[0]", manifest.offset
    )
    assert "unknown head code" in message
    # Not an integer; NaN.
    expect_error(mutate(data, manifest.offset, "<e", 1.5), "heads.manifest[0]")
    expect_error(mutate(data, manifest.offset, "<e", float("nan")), "heads.manifest[0]")
    # A manifest that is a matrix (used to crash with a TypeError), or stored as CQ.
    as_matrix = mutate(data, where, "<BBH4I", 1, 2, 0, len(codes), 1, 0, 0)
    expect_error(as_matrix, "(heads.manifest).ndim", where + 1)
    expect_error(mutate(data, where, "<B", 3), "(heads.manifest)")
    # A repeated head would give two records the same name (one silently lost).
    if len(codes) > 1:
        repeated = mutate(data, manifest.offset + 2, "<e", float(codes[0]))
        message = expect_error(repeated, "heads.manifest[1]", manifest.offset + 2)
        assert "repeats" in message


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_corrupt_tokenizer_blob(generation: str, tmp_path) -> None:
    data = tiny_bytes(generation)
    archive = open_archive(data)
    blob = archive.records[-1]
    field = f"directory[{blob.index}] (tokenizer)"
    for offset, fmt, value in [
        (0, "<I", 0),  # n_pieces
        (0, "<I", 0xFFFFFFFF),
        (0, "<I", archive.tokenizer.vocab_size - 1),  # leaves trailing bytes
        (4, "<I", 1 << 20),  # pad_id outside the vocabulary
        (20, "<B", 7),  # add_dummy_prefix
        (24 + 5, "<H", 60000),  # first piece's length runs past the blob
        (24 + 7, "<B", 0xFF),  # first piece's text is not UTF-8
    ]:
        mutated = mutate(data, blob.offset + offset, fmt, value)
        opened = open_archive(mutated)  # the tokenizer is parsed on first use
        with pytest.raises(CactFormatError) as info:
            _ = opened.tokenizer
        assert field in str(info.value) and f"(byte offset {blob.offset})" in str(info.value)
    expect_error(mutate(data, blob.offset, "<I", 0), field, blob.offset, tmp_path=tmp_path)


def test_nonfinite_codebook_is_rejected() -> None:
    data = tiny_bytes("needle3")
    start = open_archive(data).header_bytes
    expect_error(mutate(data, start + 8, "<f", float("nan")), "codebooks", start)


def test_fixture_bytes_are_untouched() -> None:
    """Mutations work on copies: after the tests above, the fixture file and the bytes they
    all share still hash to the sidecar's recorded SHA-256, and the archive still opens."""
    for generation in ("needle3", "needle2"):
        fixture = get_fixture(generation, "tiny")
        meta = fixture.meta
        recorded = meta["files"]["cact_sha256"] if generation == "needle3" else \
            meta["archive"]["sha256"]
        assert hashlib.sha256(fixture.cact.read_bytes()).hexdigest() == recorded
        assert hashlib.sha256(tiny_bytes(generation)).hexdigest() == recorded
        touch_everything(open_archive(tiny_bytes(generation)))
