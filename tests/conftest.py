"""Shared test helpers: the one place that finds the ground-truth fixtures.

The fixtures live in `../shared/fixtures/` next to the repository (see DEVELOPERS.md).
Tests that need them *fail* when the folder is missing: a missing ground truth is an
error, never a reason to skip.
"""

from __future__ import annotations

import os

# Deliberate BLAS threading for the test run (DEVELOPERS.md: spinning thread pools stall on
# 2 cores). Set before numpy is first imported so OpenBLAS reads them; a caller's explicit
# setting wins.
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
# The prepared-weight cache (needlepoint.weight_cache) stays off for the suite, so no test
# writes into ~/.cache; the cache tests switch it on with NEEDLEPOINT_CACHE_DIR in tmp_path.
os.environ.setdefault("NEEDLEPOINT_CACHE", "0")

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
# The one lookup of shared/ is the benchmarks package's (bench/needlepoint_bench/paths.py,
# issue 27 item 6): the checkout's copy, installed or not.
sys.path.insert(0, str(REPO_ROOT / "bench"))
from needlepoint_bench.paths import shared_dir as _find_shared  # noqa: E402


def shared_dir() -> Path:
    """The `shared/` folder beside the repository (override with NEEDLEPOINT_SHARED)."""
    try:
        return _find_shared(REPO_ROOT)
    except FileNotFoundError as error:
        pytest.fail(str(error))


def fixtures_dir(generation: str) -> Path:
    """`shared/fixtures/needle3` or `shared/fixtures/needle2`."""
    path = shared_dir() / "fixtures" / generation
    if not path.is_dir():
        pytest.fail(f"fixture folder missing: {path}")
    return path


NEEDLE3_FIXTURES = ("tiny", "small", "shipped")
NEEDLE2_FIXTURES = ("tiny", "small", "shipped")


class Fixture:
    """One fixture: its archive path, sidecar JSON and reference arrays (loaded lazily)."""

    def __init__(self, generation: str, name: str) -> None:
        self.generation = generation
        self.name = name
        self.folder = fixtures_dir(generation)
        self.cact = self.folder / f"{name}.cact"
        self._meta: dict | None = None
        self._arrays = None

    @property
    def meta(self) -> dict:
        if self._meta is None:
            self._meta = json.loads((self.folder / f"{self.name}.json").read_text())
        return self._meta

    @property
    def arrays(self):
        if self._arrays is None:
            self._arrays = np.load(self.folder / f"{self.name}.npz")
        return self._arrays

    def __repr__(self) -> str:
        return f"Fixture({self.generation}/{self.name})"


_CACHE: dict[tuple[str, str], Fixture] = {}


def get_fixture(generation: str, name: str) -> Fixture:
    key = (generation, name)
    if key not in _CACHE:
        _CACHE[key] = Fixture(generation, name)
    return _CACHE[key]


def toy_model_path() -> Path:
    path = shared_dir() / "models" / "needle3-toy.cact"
    if not path.is_file():
        pytest.fail(f"toy model missing: {path}")
    return path


def model_loader(generation: str, **load_options):
    """A loader that loads each fixture model once (`loader(name)`); return it from a
    module-scoped pytest fixture so the models are freed with the module."""
    import needlepoint

    loaded: dict[str, object] = {}

    def load(name: str):
        if name not in loaded:
            loaded[name] = needlepoint.load(get_fixture(generation, name).cact, **load_options)
        return loaded[name]

    return load
