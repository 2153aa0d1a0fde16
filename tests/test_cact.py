"""The `.cact` reader: every fixture reads back as its sidecar says, and every kind of bad
input is a `CactFormatError` naming the field and byte offset (never an IndexError, a
MemoryError, a hang or a silently wrong tensor). Mutated copies go to pytest's tmp_path or
straight to `open_archive` as bytes."""

from __future__ import annotations

import dataclasses
import re
import struct
import time

import numpy as np
import pytest
from conftest import NEEDLE2_FIXTURES, NEEDLE3_FIXTURES, get_fixture, toy_model_path
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from needlepoint import CactFormatError, open_archive
from needlepoint.cact import RECORD_BYTES, CactArchive, CQTensor
from needlepoint.v2.config import V2Config
from needlepoint.v3.config import V3Config

ALL_FIXTURES = [("needle3", name) for name in NEEDLE3_FIXTURES] + [
    ("needle2", name) for name in NEEDLE2_FIXTURES
]
OFFSET_RE = re.compile(r"\(byte offset \d+\)")
_BYTES: dict[str, bytes] = {}


def tiny_bytes(generation: str) -> bytes:
    if generation not in _BYTES:
        _BYTES[generation] = get_fixture(generation, "tiny").cact.read_bytes()
    return _BYTES[generation]


def directory_start(archive: CactArchive) -> int:
    return archive.header_bytes + 4 * archive.config.codebook_len


def record_at(archive: CactArchive, name: str) -> int:
    """Byte offset of a named record in the directory."""
    return directory_start(archive) + archive.record(name).index * RECORD_BYTES


def sidecar_directory(fixture) -> list[dict]:
    meta = fixture.meta
    return meta["directory"] if fixture.generation == "needle3" else meta["archive"]["tensors"]


def expect_error(data: bytes | bytearray, field: str, offset: int | None = None, *, tmp_path=None):
    """Open (and fully touch) the archive; it must fail with a message naming `field` and,
    when given, the byte offset. Goes through a real file when tmp_path is given."""
    source: object = bytes(data)
    if tmp_path is not None:
        source = tmp_path / "mutated.cact"
        source.write_bytes(bytes(data))
    with pytest.raises(CactFormatError) as info:
        touch_everything(open_archive(source))
    message = str(info.value)
    assert field in message, message
    assert OFFSET_RE.search(message), message
    if offset is not None:
        assert f"(byte offset {offset})" in message, message
    return message


def touch_everything(archive: CactArchive) -> None:
    """Decode every tensor and the tokenizer: what "the archive works" means."""
    with np.errstate(all="ignore"):  # mutated FP16 weights may be inf/NaN: that is data
        for record in archive.records:
            if record.dtype != "raw":
                values = archive.floats(record.name)
                assert values.shape == record.shape
                assert values.dtype == np.float32
    assert archive.tokenizer.vocab_size > 0


def mutate(data: bytes, offset: int, fmt: str, *values) -> bytearray:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return out


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
    # Mutations work on copies: the fixture must still open cleanly afterwards.
    for generation in ("needle3", "needle2"):
        touch_everything(open_archive(get_fixture(generation, "tiny").cact))


# -- fuzzing -------------------------------------------------------------------------------------
INTERESTING_WORDS = [0, 1, 2, 3, 4, 5, 7, 8, 16, 63, 64, 127, 128, 255, 256, 1 << 16, 1 << 20,
                     (1 << 24) - 1, 1 << 24, (1 << 24) + 1, 1 << 31, (1 << 32) - 1]


@st.composite
def mutated_archives(draw) -> bytes:
    """A tiny fixture with a few bytes/words overwritten (mostly in the header and directory,
    some in the blobs and the tokenizer blob), then possibly truncated."""
    generation = draw(st.sampled_from(["needle3", "needle2"]))
    data = bytearray(tiny_bytes(generation))
    archive = pristine(generation)
    data_start = directory_start(archive) + RECORD_BYTES * len(archive.records)
    tokenizer = archive.records[-1]
    for _ in range(draw(st.integers(0, 4))):
        region = draw(st.integers(0, 9))
        if region < 7:  # header (after the tag), codebooks, directory
            position = draw(st.integers(4, data_start - 1))
        elif region < 8:  # tokenizer blob
            position = tokenizer.offset + draw(st.integers(0, min(tokenizer.nbytes, 400) - 1))
        else:  # anywhere
            position = draw(st.integers(0, len(data) - 1))
        kind = draw(st.integers(0, 2))
        if kind == 0:
            data[position] = draw(st.integers(0, 255))
        elif kind == 1:
            data[position] ^= 1 << draw(st.integers(0, 7))
        else:
            position = min(position - position % 4, len(data) - 4)
            word = draw(st.one_of(st.sampled_from(INTERESTING_WORDS), st.integers(0, 2**32 - 1)))
            struct.pack_into("<I", data, position, word)
    if draw(st.integers(0, 4)) == 0:
        cut = draw(st.one_of(st.integers(0, data_start + 64), st.integers(0, len(data))))
        data = data[:cut]
    return bytes(data)


_OPENED: dict[str, CactArchive] = {}


def pristine(generation: str) -> CactArchive:
    if generation not in _OPENED:
        _OPENED[generation] = open_archive(tiny_bytes(generation))
    return _OPENED[generation]


@settings(
    max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
@given(data=mutated_archives())
def test_fuzz_mutated_and_truncated_archives(data: bytes) -> None:
    """Only two outcomes: CactFormatError, or an archive whose every tensor and tokenizer
    decodes (mutated weights are data, NaN included)."""
    try:
        archive = open_archive(data)
        touch_everything(archive)
    except CactFormatError as error:
        assert OFFSET_RE.search(str(error)), str(error)
        field = str(error).split(" (byte offset")[0].split(": ")[-1]
        event("CactFormatError " + re.sub(r"\[\d+\] \([\w.]+\)", "[k]", field))
    else:
        event("opened and decoded")
