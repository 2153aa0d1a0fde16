"""FWHT and Cactus-Quants kernels against slow references written from the fixture READMEs
("CQ tensors" / "Cactus-Quants (CQ)") and against the fixtures' stored dequantised arrays."""

from __future__ import annotations

import math
import struct
from functools import cache

import numpy as np
import pytest
from conftest import get_fixture
from hypothesis import given, settings
from hypothesis import strategies as st

from needlepoint import open_archive
from needlepoint.formats.cact import CactArchive, CQTensor
from needlepoint.kernels import (
    dequantize,
    dequantize_row,
    dequantize_rows,
    fwht,
    fwht_groups,
    hadamard_matrix,
    matmul,
    matvec,
    rotated_weights,
    unpack_indices,
)

STORAGE = {1: 1, 2: 2, 3: 3, 4: 4, 5: 2}  # bits 5 = ternary crumbs, stored in 2 bits
_ARCHIVES: dict[tuple[str, str], CactArchive] = {}


def archive(generation: str, name: str = "tiny") -> CactArchive:
    if (generation, name) not in _ARCHIVES:
        _ARCHIVES[generation, name] = open_archive(get_fixture(generation, name).cact)
    return _ARCHIVES[generation, name]


# -- slow references, straight from the README text ---------------------------------------------
@cache
def reference_hadamard(n: int) -> np.ndarray:
    """`H[i, j] = (-1)^popcount(i & j) / sqrt(n)`, float64, element by element."""
    scale = 1.0 / math.sqrt(n)
    rows = [[(-1.0) ** bin(i & j).count("1") * scale for j in range(n)] for i in range(n)]
    return np.array(rows, dtype=np.float64)


def reference_codebooks(path) -> dict[int, list[float]]:
    """Read the 28 header codebook floats with struct; bits 1 and 5 from the README text."""
    data = path.read_bytes()
    tag = struct.unpack_from("<I", data, 0)[0]
    header = 196 if tag == 0x05E12A84 else 120
    flat = struct.unpack_from("<28f", data, header)
    root = math.sqrt(128)
    c = 1.2240064 / root
    return {
        1: [-math.sqrt(2 / math.pi) / root, math.sqrt(2 / math.pi) / root],
        2: list(flat[0:4]),
        3: list(flat[4:12]),
        4: list(flat[12:28]),
        5: [0.0, c, 0.0, -c],  # codes 3/0/1 = -c/0/+c (code 2 unused)
    }


def reference_index(row_bytes: bytes, k: int, width: int) -> int:
    """Index k of an LSB-first bit stream: bits [k*width, (k+1)*width)."""
    value = 0
    for b in range(width):
        bit = k * width + b
        value |= ((row_bytes[bit // 8] >> (bit % 8)) & 1) << b
    return value


def reference_dequantize_row(cq: CQTensor, row: int, books: dict[int, list[float]]) -> np.ndarray:
    """One row, one value at a time: unpack, look up, scale by the group norm, rotate by H."""
    width = STORAGE[cq.bits]
    row_bytes = bytes(cq.packed[row])
    book = books[cq.bits]
    out: list[float] = []
    for j in range(cq.norms.shape[1]):
        norm = float(cq.norms[row, j])
        values = [
            book[reference_index(row_bytes, j * cq.group + k, width)] * norm
            for k in range(cq.group)
        ]
        out.extend((np.array(values) @ reference_hadamard(cq.group)).tolist())
    return np.array(out[: cq.cols])


def reference_pack(indices: np.ndarray, width: int) -> np.ndarray:
    """Pack [rows, in_pad] indices into LSB-first per-row bit streams, bit by bit."""
    rows, count = indices.shape
    out = np.zeros((rows, count * width // 8), np.uint8)
    for r in range(rows):
        for k in range(count):
            for b in range(width):
                if int(indices[r, k]) >> b & 1:
                    bit = k * width + b
                    out[r, bit // 8] |= 1 << (bit % 8)
    return out


def synthetic_cq(bits: int, rows: int, cols: int, group: int, seed: int, books):
    """A random CQ tensor of any width (the fixtures only have 2 and 4 bits)."""
    rng = np.random.default_rng(seed)
    in_pad = -(-cols // group) * group
    choices = [0, 1, 3] if bits == 5 else list(range(1 << STORAGE[bits]))
    indices = rng.choice(choices, size=(rows, in_pad)).astype(np.uint8)
    norms = rng.uniform(0.1, 3.0, size=(rows, in_pad // group)).astype(np.float16)
    packed = reference_pack(indices, STORAGE[bits])
    codebook = np.array(books[bits], np.float32)
    cq = CQTensor(f"synthetic{bits}", rows, cols, bits, group, packed, norms, codebook)
    return cq, indices


def cq_names(arch: CactArchive) -> list[str]:
    return [record.name for record in arch.records if record.dtype == "cq"]


# -- FWHT ---------------------------------------------------------------------------------------
shapes = st.tuples(
    st.lists(st.integers(1, 4), min_size=0, max_size=3), st.integers(0, 10), st.integers(0, 2**31)
)


@settings(max_examples=150, deadline=None)
@given(shapes)
def test_fwht_is_an_involution(spec) -> None:
    lead, log_n, seed = spec
    n = 1 << log_n
    x = np.random.default_rng(seed).standard_normal((*lead, n)).astype(np.float32)
    scale = max(1.0, float(np.abs(x).max()))
    once = fwht(x, normalize=False)
    assert once.shape == x.shape and once.dtype == np.float32
    np.testing.assert_allclose(fwht(once, normalize=False), n * x, rtol=1e-5, atol=1e-5 * n * scale)
    np.testing.assert_allclose(fwht(fwht(x)), x, rtol=1e-5, atol=1e-5 * scale)
    # Parseval: the normalised transform is orthonormal.
    np.testing.assert_allclose(
        np.linalg.norm(fwht(x), axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64, 128])
def test_fwht_matches_the_definition(n: int) -> None:
    x = np.random.default_rng(n).standard_normal((3, n))
    expected = x @ reference_hadamard(n)
    np.testing.assert_allclose(fwht(x), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fwht(x, normalize=False), expected * math.sqrt(n), atol=1e-4)
    np.testing.assert_allclose(hadamard_matrix(n), reference_hadamard(n), atol=1e-7)
    np.testing.assert_allclose(
        hadamard_matrix(n, normalize=False), reference_hadamard(n) * math.sqrt(n), atol=0
    )


def test_hadamard_matrix_properties() -> None:
    h = hadamard_matrix(128)
    assert h.dtype == np.float32 and not h.flags.writeable
    np.testing.assert_array_equal(h, h.T)
    np.testing.assert_allclose(h @ h, np.eye(128), atol=1e-6)


def test_fwht_rejects_bad_lengths_and_keeps_input() -> None:
    for n in (3, 6, 96, 0):
        with pytest.raises(ValueError, match="power of two"):
            fwht(np.ones(n))
    x = np.arange(8, dtype=np.float32)
    before = x.copy()
    fwht(x)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("width,group", [(96, 128), (128, 128), (384, 128), (48, 32), (1, 8)])
def test_fwht_groups_pads_and_rotates_each_group(width: int, group: int) -> None:
    x = np.random.default_rng(width).standard_normal((2, 5, width)).astype(np.float32)
    got = fwht_groups(x, group)
    padded = -(-width // group) * group
    assert got.shape == (2, 5, padded)
    full = np.zeros((2, 5, padded))
    full[..., :width] = x
    expected = (full.reshape(2, 5, -1, group) @ reference_hadamard(group)).reshape(2, 5, padded)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# -- unpacking every width ----------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_unpack_synthetic_widths_against_bit_stream(bits: int) -> None:
    books = reference_codebooks(get_fixture("needle3", "tiny").cact)
    cq, indices = synthetic_cq(bits, rows=6, cols=200, group=128, seed=bits, books=books)
    assert cq.packed.shape == (6, 256 * STORAGE[bits] // 8)
    np.testing.assert_array_equal(unpack_indices(cq), indices)
    np.testing.assert_array_equal(unpack_indices(cq, slice(2, 4)), indices[2:4])
    np.testing.assert_array_equal(unpack_indices(cq, np.array([5, 0])), indices[[5, 0]])
    row_bytes = bytes(cq.packed[3])
    assert [reference_index(row_bytes, k, STORAGE[bits]) for k in range(256)] == list(indices[3])


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_dequantize_synthetic_widths(bits: int) -> None:
    books = reference_codebooks(get_fixture("needle3", "tiny").cact)
    cq, _ = synthetic_cq(bits, rows=5, cols=150, group=64, seed=10 + bits, books=books)
    full = dequantize(cq)
    assert full.shape == (5, 150) and full.dtype == np.float32
    for row in range(5):
        expected = reference_dequantize_row(cq, row, books)
        np.testing.assert_allclose(full[row], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dequantize_row(cq, row), expected, rtol=1e-5, atol=1e-6)
    x = np.random.default_rng(bits).standard_normal(150).astype(np.float32)
    np.testing.assert_allclose(matvec(cq, x), full @ x, rtol=1e-4, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(
    bits=st.sampled_from([1, 2, 3, 4, 5]),
    rows=st.integers(1, 4),
    group=st.sampled_from([8, 16, 32, 128]),
    groups=st.integers(1, 3),
    short=st.integers(0, 7),
    seed=st.integers(0, 2**31),
)
def test_unpack_roundtrip_any_geometry(bits, rows, group, groups, short, seed) -> None:
    books = reference_codebooks(get_fixture("needle3", "tiny").cact)
    cols = max(1, group * groups - short)
    cq, indices = synthetic_cq(bits, rows, cols, group, seed, books)
    np.testing.assert_array_equal(unpack_indices(cq), indices)
    weights = rotated_weights(cq)
    expected = np.array(books[bits], np.float32)[indices].reshape(rows, -1, group)
    expected = (expected * cq.norms.astype(np.float32)[:, :, None]).reshape(rows, -1)
    np.testing.assert_array_equal(weights, expected)


# -- fixture tensors ----------------------------------------------------------------------------
def test_fixture_widths_are_two_and_four() -> None:
    widths = set()
    for generation in ("needle3", "needle2"):
        widths |= {archive(generation).record(name).bits for name in cq_names(archive(generation))}
    assert widths == {2, 4}


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_slow_reference_on_every_cq_tensor(generation: str) -> None:
    arch = archive(generation)
    books = reference_codebooks(get_fixture(generation, "tiny").cact)
    for bits in (2, 3, 4):
        np.testing.assert_array_equal(arch.codebooks[bits], np.array(books[bits], np.float32))
    for name in cq_names(arch):
        cq = arch.cq(name)
        for row in sorted({0, cq.rows // 2, cq.rows - 1}):
            expected = reference_dequantize_row(cq, row, books)
            np.testing.assert_allclose(
                dequantize_row(cq, row), expected, rtol=1e-5, atol=1e-6, err_msg=f"{name}[{row}]"
            )


@pytest.mark.parametrize("generation", ["needle3", "needle2"])
def test_matvec_and_matmul_agree_with_dequantize(generation: str) -> None:
    arch = archive(generation)
    rng = np.random.default_rng(7)
    for name in cq_names(arch):
        cq = arch.cq(name)
        if cq.rows > 4096:
            continue  # keep it quick: the embedding is covered by its rows below
        dense = dequantize(cq)
        assert dense.shape == (cq.rows, cq.cols)
        x = rng.standard_normal(cq.cols).astype(np.float32)
        y = matvec(cq, x)
        assert y.shape == (cq.rows,) and y.dtype == np.float32
        scale = float(np.abs(dense).max() * np.abs(x).sum()) + 1e-30
        for row in sorted({0, cq.rows // 3, cq.rows - 1}):
            assert abs(y[row] - float(dequantize_row(cq, row) @ x)) <= 1e-5 * scale, name
        batch = rng.standard_normal((2, 3, cq.cols)).astype(np.float32)
        np.testing.assert_allclose(
            matmul(cq, batch), batch @ dense.T, rtol=1e-4, atol=1e-5 * scale, err_msg=name
        )
    emb = arch.cq("embedding")
    ids = np.array([0, 5, emb.rows - 1, 5])
    np.testing.assert_allclose(
        dequantize_rows(emb, ids), np.stack([dequantize_row(emb, i) for i in ids]), atol=1e-6
    )
    np.testing.assert_array_equal(dequantize_row(emb, -1), dequantize_row(emb, emb.rows - 1))


def test_kernel_argument_errors() -> None:
    cq = archive("needle3").cq("layer00.q_proj")
    with pytest.raises(IndexError):
        dequantize_row(cq, cq.rows)
    with pytest.raises(ValueError, match="width"):
        matvec(cq, np.ones(cq.cols + 1, np.float32))


def _deq_name(key: str) -> tuple[str, int | None]:
    """`deq_layer00__q_proj` -> ("layer00.q_proj", None); `deq_embedding_rows0to7` ->
    ("embedding", 8)."""
    name = key[len("deq_"):].replace("__", ".")
    if name.endswith("_rows0to7"):
        return name[: -len("_rows0to7")], 8
    return name, None


@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_needle3_stored_dequantised_arrays_match_exactly(name: str) -> None:
    fixture = get_fixture("needle3", name)
    arch = archive("needle3", name)
    keys = [key for key in fixture.arrays.files if key.startswith("deq_")]
    assert len(keys) >= 6
    for key in keys:
        tensor, rows = _deq_name(key)
        if rows is None:
            got = arch.floats(tensor)
        else:
            got = dequantize_rows(arch.cq(tensor), slice(0, rows))
        expected = fixture.arrays[key]
        assert got.shape == expected.shape, key
        np.testing.assert_array_equal(got, expected, err_msg=key)
    tokens = fixture.arrays["p0_tokens"]
    emb = arch.cq("embedding")
    np.testing.assert_array_equal(
        dequantize_row(emb, int(tokens[0])), fixture.arrays["emb_row_first_token"]
    )


@pytest.mark.parametrize("name", ["tiny", "small", "shipped"])
def test_needle2_ladder_embedding_rows_match_exactly(name: str) -> None:
    fixture = get_fixture("needle2", name)
    arch = archive("needle2", name)
    keys = [key for key in fixture.arrays.files if key.endswith("_ladder_embedding_rows")]
    assert keys, "every needle2 fixture has a ladder prompt"
    for key in keys:
        prompt = key.split("_")[0]
        positions = fixture.meta["prompts"][int(prompt[1:])]["ladder_positions"]
        ids = fixture.arrays[f"{prompt}_ids"][:positions]
        got = dequantize_rows(arch.cq("embedding"), ids)
        np.testing.assert_array_equal(got, fixture.arrays[key], err_msg=key)
