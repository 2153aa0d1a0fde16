"""Needle 3 prepared weights: the arena equals the dequantised archive bit for bit, and the
on-disk weight cache (`needlepoint.weight_cache`) is used only when valid: corrupt,
mismatched, truncated or unwritable caches fall back to building, never to wrong weights.

The suite runs with the cache off (conftest); tests here switch it on with their own
`NEEDLEPOINT_CACHE_DIR` under `tmp_path`, so nothing is written anywhere else."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from conftest import NEEDLE3_FIXTURES, get_fixture

import needlepoint
from needlepoint.kernels import dequantize, hadamard_matrix
from needlepoint.kernels.pinned import dequant_rows
from needlepoint.models import weight_cache
from needlepoint.models.needle3 import weights as v3weights


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("NEEDLEPOINT_CACHE", "1")
    monkeypatch.setenv("NEEDLEPOINT_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def archive_copy(tmp_path):
    path = tmp_path / "tiny.cact"
    shutil.copyfile(get_fixture("needle3", "tiny").cact, path)
    return path


def _load(path, **kwargs):
    model = needlepoint.load(path, numerics="float", **kwargs)
    weight_cache.flush()
    return model


def _matrices(model) -> list[np.ndarray]:
    w = model.weights
    out = [w.lm_head] + [site.key_value for site in w.engram]
    for layer in w.layers:
        out += [layer.qkvg, layer.out_proj, layer.mhc.phi]
    return out


def _logits(model) -> np.ndarray:
    tokens = get_fixture("needle3", "tiny").arrays["p3_tokens"]
    return model.forward(tokens)


def _files(folder) -> list:
    return sorted(folder.glob("*.npw")) if folder.is_dir() else []


class Builds:
    """Counts `Filler` calls: zero means the weights came from the cache file."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        original = v3weights.Filler.__call__

        def counted(filler, slot, out):
            self.count += 1
            return original(filler, slot, out)

        monkeypatch.setattr(v3weights.Filler, "__call__", counted)


@pytest.mark.parametrize("name", NEEDLE3_FIXTURES)
def test_arena_is_the_dequantised_archive(name):
    """Every fused matrix equals `kernels.cq.dequantize` of its parts, bit for bit; the LM
    head is the embedding in the rotated domain (`W = R H` per 128-group)."""
    model = needlepoint.load(get_fixture("needle3", name).cact, numerics="float", cache=False)
    archive, w, n = model.archive, model.weights, model.config.mhc_lanes

    def deq(record, rows=slice(None)):
        return dequantize(archive.cq(record))[rows].T

    for new, old in enumerate(model.layer_indices):
        layer, p = w.layers[new], f"layer{old:02d}."
        parts = [deq(p + part) for part in ("q_proj", "k_proj", "v_proj", "gate_proj")]
        np.testing.assert_array_equal(layer.qkvg, np.concatenate(parts, axis=1))
        np.testing.assert_array_equal(layer.out_proj, deq(p + "out_proj"))
        phi = [deq("mhc_phi_pre", slice(old * n, (old + 1) * n)),
               deq("mhc_phi_post", slice(old * n, (old + 1) * n)),
               deq("mhc_phi_res", slice(old * n * n, (old + 1) * n * n))]
        np.testing.assert_array_equal(layer.mhc.phi, np.concatenate(phi, axis=1))
    for index, site in enumerate(w.engram):
        kv = [deq(f"engram{index}.key_proj"), deq(f"engram{index}.value_proj")]
        np.testing.assert_array_equal(site.key_value, np.concatenate(kv, axis=1))
    vocab, width = w.lm_head.shape[1], model.config.d_model
    head = np.ascontiguousarray(w.lm_head.T)
    # `R @ H` in the pinned order of `dequantize` (kernels.pinned), not BLAS's own
    unrotated = dequant_rows(head.reshape(vocab, -1, 128), float(hadamard_matrix(128)[0, 0]))
    np.testing.assert_array_equal(unrotated[:, :width], deq("embedding", slice(vocab)).T)
    for matrix in _matrices(model):
        assert matrix.flags.c_contiguous and not matrix.flags.writeable


def test_cache_round_trip(cache_dir, archive_copy, monkeypatch):
    built = _load(archive_copy)
    (file,) = _files(cache_dir)
    builds = Builds(monkeypatch)
    cached = _load(archive_copy)
    assert builds.count == 0  # mapped, not built
    assert _files(cache_dir) == [file]
    for a, b in zip(_matrices(built), _matrices(cached), strict=True):
        np.testing.assert_array_equal(a, b)
        assert not b.flags.writeable
    np.testing.assert_array_equal(_logits(built), _logits(cached))
    rung = _load(archive_copy, layers=2)  # a ladder rung has its own file
    assert len(_files(cache_dir)) == 2
    again = _load(archive_copy, layers=2)
    assert builds.count == len(v3weights.plan(rung.archive, rung.config, rung.layer_indices))
    np.testing.assert_array_equal(_logits(rung), _logits(again))


@pytest.mark.parametrize(
    "damage", ["truncate", "header", "footer", "payload", "garbage", "empty"]
)
def test_corrupt_cache_is_rebuilt(cache_dir, archive_copy, monkeypatch, damage):
    reference = _logits(needlepoint.load(archive_copy, numerics="float", cache=False))
    _load(archive_copy)
    (file,) = _files(cache_dir)
    data = bytearray(file.read_bytes())
    if damage == "truncate":
        data = data[:-100]
    elif damage == "header":
        data[weight_cache.HEADER.size - 1] ^= 0xFF  # last byte of the key
    elif damage == "footer":
        data[-1] ^= 0xFF
    elif damage == "payload":
        data[weight_cache.HEADER_BYTES + 5] ^= 0x40  # inside the first sampled page
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:
        data = bytearray()
    file.write_bytes(bytes(data))
    builds = Builds(monkeypatch)
    model = _load(archive_copy)
    assert builds.count > 0
    np.testing.assert_array_equal(_logits(model), reference)
    builds.count = 0
    _load(archive_copy)  # the rebuilt file replaced the bad one
    assert builds.count == 0 and len(_files(cache_dir)) == 1


def test_changed_archive_is_not_served_stale(cache_dir, archive_copy, monkeypatch):
    _load(archive_copy)
    (old,) = _files(cache_dir)
    stat = archive_copy.stat()
    os.utime(archive_copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    builds = Builds(monkeypatch)
    _load(archive_copy)
    assert builds.count > 0
    (new,) = _files(cache_dir)  # the stale version of this archive path was removed
    assert new != old


def test_cache_switches(cache_dir, archive_copy, monkeypatch):
    _load(archive_copy, cache=False)
    assert _files(cache_dir) == []
    monkeypatch.setenv("NEEDLEPOINT_CACHE", "0")
    _load(archive_copy)
    assert _files(cache_dir) == []
    _load(archive_copy, cache=True)
    assert len(_files(cache_dir)) == 1
    data = get_fixture("needle3", "tiny").cact.read_bytes()
    needlepoint.load(data, cache=True)  # bytes have no path: built, nothing cached
    weight_cache.flush()
    assert len(_files(cache_dir)) == 1


def test_unusable_cache_dir_still_loads(tmp_path, archive_copy, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("NEEDLEPOINT_CACHE", "1")
    monkeypatch.setenv("NEEDLEPOINT_CACHE_DIR", str(blocker / "cache"))
    reference = _logits(needlepoint.load(archive_copy, numerics="float", cache=False))
    np.testing.assert_array_equal(_logits(_load(archive_copy)), reference)
    assert not list(tmp_path.glob("**/*.npw")) and not list(tmp_path.glob("**/*.tmp"))
