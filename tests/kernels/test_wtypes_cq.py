"""The Needle CQ types as entries of the weight-type table (`kernels.wtypes`): every type is
listed once, each CQ record's block layout is the archive's bytes, its dequantiser and row
gather give `kernels.cq`'s floats (and the fixtures' stored `deq_*` samples), and its exact
product (native when built) gives its numpy reference's bits."""

from __future__ import annotations

import numpy as np
import pytest
from cact_helpers import cq_samples
from conftest import get_fixture

from needlepoint import open_archive
from needlepoint.errors import UnsupportedTensorTypeError
from needlepoint.kernels import cq, exact, wtypes
from needlepoint.kernels.blockweight import matmul, matmul_reference

GGUF = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
# README "CQ tensors": the `bits` codes a record may carry, stored bits per index, levels
CQ = {"CQ1": (1, 1, 2), "CQ2": (2, 2, 4), "CQ3": (3, 3, 8), "CQ4": (4, 4, 16), "CQT": (5, 2, 4)}
ARCHIVES = [("needle3", "tiny"), ("needle3", "small"), ("needle2", "tiny")]


def _archive(generation: str, name: str):
    return open_archive(get_fixture(generation, name).cact)


def _cq_names(archive) -> list[str]:
    return [r.name for r in archive.records if r.dtype == "cq"]


def test_the_table_lists_every_type_once() -> None:
    assert set(wtypes.TYPES) == GGUF | {"F32", "F16", "BF16"} | set(CQ)
    assert {t.name for t in wtypes.TYPES.values() if t.kind == "block"} == GGUF
    assert {t.name for t in wtypes.TYPES.values() if t.kind == "float"} == {"F32", "F16", "BF16"}
    for name, (code, storage, levels) in CQ.items():
        record = wtypes.TYPES[name]
        assert wtypes.cq_type(code) is record
        assert (record.kind, record.code, record.storage_bits, record.codebook_len) == (
            "cq", code, storage, levels)
        # a 128-group: its codes (128 indices of `storage` bits) and one FP16 norm
        assert (record.block_values, record.block_bytes) == (128, 128 * storage // 8 + 2)
        assert record.native_entry == "np_cq_matmul_threads" and record.native_id == storage
    for record in wtypes.TYPES.values():
        assert record.dequantize is not None and record.gather is not None, record.name
        if record.kind != "float":
            assert record.product is not None and record.product_reference is not None
    assert wtypes.TYPES["Q4_K"].product is matmul
    assert wtypes.TYPES["Q4_K"].product_reference is matmul_reference
    with pytest.raises(UnsupportedTensorTypeError, match="CQ code 7"):
        wtypes.cq_type(7)


@pytest.mark.parametrize(("generation", "name"), ARCHIVES)
def test_cq_records_size_the_archive_blobs(generation: str, name: str) -> None:
    archive = _archive(generation, name)
    seen = set()
    for tensor in _cq_names(archive):
        record, wtype = archive.record(tensor), archive.wtype(tensor)
        seen.add(wtype.name)
        rows, cols = record.shape[0], int(np.prod(record.shape[1:]))
        assert wtypes.cq_tensor_bytes(wtype, rows, cols, record.group) == record.nbytes
        stored = archive.cq(tensor)
        assert stored.storage_bits == wtype.storage_bits
        assert stored.packed.shape[1] + 2 * stored.norms.shape[1] == \
            wtype.row_bytes(stored.in_pad)
    assert seen == {"CQ2", "CQ4"}  # what the fixture archives hold


@pytest.mark.parametrize(("generation", "name"), ARCHIVES)
def test_cq_dequantiser_and_gather_are_the_cq_kernels(generation: str, name: str) -> None:
    archive = _archive(generation, name)
    rows = np.array([0, 3, 1, 3])
    for tensor in _cq_names(archive):
        stored, wtype = archive.cq(tensor), archive.wtype(tensor)
        full = wtype.dequantize(stored)
        np.testing.assert_array_equal(full, cq.dequantize(stored), err_msg=tensor)
        picked = rows[rows < stored.rows]
        np.testing.assert_array_equal(wtype.gather(stored, picked), full[picked],
                                      err_msg=tensor)


def test_cq_dequantiser_gives_the_fixture_samples() -> None:
    fixture = get_fixture("needle3", "tiny")
    archive = _archive("needle3", "tiny")
    checked = 0
    for key, tensor, count in cq_samples(fixture, archive):
        rows = None if count is None else np.arange(count)
        wtype = archive.wtype(tensor)
        stored = archive.cq(tensor)
        got = wtype.dequantize(stored) if rows is None else wtype.gather(stored, rows)
        expected = fixture.arrays[key]
        np.testing.assert_array_equal(got.reshape(expected.shape), expected, err_msg=key)
        checked += 1
    assert checked >= 4


def test_float_table_gather_casts_the_stored_rows() -> None:
    table = (np.arange(24, dtype=np.float32).reshape(6, 4) / 7).astype(np.float16)
    got = wtypes.TYPES["F16"].gather(table, [5, 0])
    np.testing.assert_array_equal(got, table[[5, 0]].astype(np.float32))
    raw = wtypes.TYPES["F16"].gather(table.view(np.uint8), [5, 0])
    np.testing.assert_array_equal(raw, got)


@pytest.mark.parametrize("tensor", ["layer00.q_proj", "embedding", "mhc_phi_res"])
def test_cq_product_entry_equals_its_reference(tensor: str) -> None:
    archive = _archive("needle3", "tiny")
    wtype = archive.wtype(tensor)
    stored = archive.cq(tensor)
    (matrix,) = exact.exact_matrices([(stored, 0, stored.rows)])
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, stored.cols)).astype(np.float32)
    x[1] = 0.0
    x[2, ::3] *= 40.0
    v, scale = exact.a8_rotate_reference(x, matrix.in_pad)
    got = wtype.product(v, scale, matrix)
    want = wtype.product_reference(v, scale, matrix)
    assert got.shape == (5, stored.rows)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # and the reference is the dequantised matrix's product, up to float rounding
    close = (x @ cq.dequantize(stored).T)
    np.testing.assert_allclose(want, close, rtol=0.05, atol=0.05 * np.abs(close).max())
