"""The int8 blocks of a float checkpoint's weights, converted once and cached beside the model.

In int8 numerics every 2-D float weight (safetensors F32 / F16 / BF16, a GGUF F32 / F16 /
BF16 tensor) becomes block-scaled int8 codes at load (`linear.make_int8_linear`, the
`kernels.i8.I8Weight` layout); for a 135M model that is most of a load. `Int8Store` keeps those
weights in one file: the first int8 load converts as before and writes every converted weight
(its codes, scales and offsets, as the kernels take them); later loads map the file read-only
and hand the kernels `I8Weight`s whose arrays are views of the mapping (zero-copy: no
conversion, and the pages are the page cache's, shared between processes). The values are the
ones the conversion gives, so the results are the same bits with or without the file.

* Where, and off: as the Needle prepared-weight cache (`models/weight_cache.py`):
  `$NEEDLEPOINT_CACHE_DIR`, else `$XDG_CACHE_HOME/needlepoint`, else `~/.cache/needlepoint`;
  `NEEDLEPOINT_CACHE=0` (or `cache=False`) turns it off. One file per checkpoint path and
  part of the model (layers kept, blocks, head): `<name>-<tag>-<key>.npi8`; a rebuilt file
  replaces the older ones of the same tag.
* Key: sha256 of the format version, the part, and each source file's (config, weights) name,
  size, mtime and first `HEAD_BYTES` bytes (the safetensors / GGUF header).
* Layout: a page of header (magic, version, key, index length), the JSON index (per weight:
  name, geometry, byte ranges), then three regions, each page-aligned, holding the codes, the
  scales and the offsets of every weight back to back in the order the load asked for them: so
  the parts of a projection that `linear.fuse` joins (q | k | v, gate | up) lie end to end and
  join as views, not copies. A footer repeats the key with a CRC-32 of the index and of one
  4 KiB page per MiB of the regions.
* Safety: written to a temp file and renamed into place. A file is used only if its size,
  header, index and footer all match and every weight the load asks for is in it with the
  geometry asked; anything else (truncated, stale, another part) means the weights are
  converted as without a cache and the file rewritten. An unwritable folder is logged, never
  an error.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ...kernels.i8 import I8Weight
from .. import weight_cache

FORMAT_VERSION = 1
MAGIC = b"NPI8CACH"
FOOTER_MAGIC = b"NPI8-END"
HEADER = struct.Struct("<8sI32sQ")  # magic, version, key, index bytes
FOOTER = struct.Struct("<8s32sII")  # magic, key, CRC-32 of the index, of the sampled regions
PAGE = 4096
HEAD_BYTES = 1 << 20
SAMPLE_STRIDE = 1 << 20
FIELDS = ("data", "scale", "offset")  # the three arrays of an I8Weight, one region each
log = logging.getLogger(__name__)


def _arrays(w: I8Weight) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return w.data, w.scale, w.offset


def _aligned(n: int) -> int:
    return -(-n // PAGE) * PAGE


class Int8Store:
    """The converted weights of one load: `weight(name, build)` is the cached weight when the
    file holds it, else `build()` (recorded); `finish()` writes the file if anything was built."""

    def __init__(self, path: Path | None, key: bytes, threads: int = 1) -> None:
        self.path, self.key, self.threads = path, key, threads
        self.mapped: dict[str, I8Weight] = {}
        self.order: list[tuple[str, I8Weight]] = []
        self.built = 0
        self.build_seconds = 0.0
        self.mapped_bytes = 0
        if path is not None:
            try:
                self.mapped = _read(path, key)
            except Exception as error:  # noqa: BLE001 - a bad cache must never stop a load
                log.debug("int8 weight cache %s unreadable: %s", path, error)
            self.mapped_bytes = sum(w.nbytes for w in self.mapped.values())

    def weight(self, name: str, n_out: int, k_in: int, build: Callable[[], I8Weight]
               ) -> I8Weight:
        """Weight `name` ([n_out, k_in]): from the file, or `build()` now."""
        found = self.mapped.get(name)
        if found is None or (found.n_out, found.k_in) != (n_out, k_in):
            start = time.perf_counter()
            found = build()
            self.build_seconds += time.perf_counter() - start
            self.built += 1
        else:
            found = I8Weight(found.n_out, found.k_in, found.bits, found.data, found.scale,
                             found.offset, self.threads)
        self.order.append((name, found))
        return found

    def finish(self) -> None:
        """Write the file when a weight was converted in this load (log what was done)."""
        if self.path is None or not self.order:
            return
        if not self.built:
            log.info("int8 weight cache: %d weights (%d bytes) mapped from %s",
                     len(self.order), self.mapped_bytes, self.path)
            return
        written = _write(self.path, self.key, self.order)
        log.info("int8 weight cache: %d weights converted in %.2f s, %s", self.built,
                 self.build_seconds,
                 f"{written} bytes written to {self.path}" if written else "not written")


def open_store(sources: Sequence[Path], label: str, part: str, enabled: bool | None,
               threads: int = 1) -> Int8Store | None:
    """The store of one load (None when the cache is off or a source cannot be read):
    `sources` the checkpoint's files, `label` its name, `part` what is loaded of it."""
    if not weight_cache.enabled(enabled) or not sources:
        return None
    try:
        key = _key(sources, part)
    except OSError as error:
        log.debug("int8 weight cache off: %s", error)
        return None
    import hashlib

    where = f"{Path(sources[0]).resolve().parent}|{label}|{part}"
    tag = hashlib.sha256(where.encode()).hexdigest()[:12]
    name = f"{label}-{tag}-{key.hex()[:24]}.npi8"
    return Int8Store(weight_cache.cache_dir() / name, key, threads)


def _key(sources: Sequence[Path], part: str) -> bytes:
    import hashlib  # here, not at import: it maps OpenSSL even with the cache off

    digest = hashlib.sha256(f"v{FORMAT_VERSION}|{part}".encode())
    for source in sources:
        stat = os.stat(source)
        digest.update(f"|{Path(source).name}|{stat.st_size}|{stat.st_mtime_ns}|".encode())
        with open(source, "rb") as handle:
            digest.update(handle.read(HEAD_BYTES))
    return digest.digest()


# -- file ------------------------------------------------------------------------------------
def _layout(order: Sequence[tuple[str, I8Weight]]) -> tuple[list[dict], list[int]]:
    """Index entries (byte ranges relative to each region) and the regions' sizes."""
    cursor = [0, 0, 0]
    entries = []
    for name, w in order:
        entry = {"name": name, "n_out": w.n_out, "k_in": w.k_in, "bits": w.bits}
        for region, (field, array) in enumerate(zip(FIELDS, _arrays(w), strict=True)):
            if array is None:
                continue
            entry[field] = [cursor[region], array.dtype.str, list(array.shape)]
            cursor[region] += array.nbytes
        entries.append(entry)
    return entries, [_aligned(c) for c in cursor]


def _sample_crc(regions: memoryview) -> int:
    crc = 0
    for start in range(0, len(regions), SAMPLE_STRIDE):
        crc = zlib.crc32(regions[start : start + PAGE], crc)
    return crc


def _write(path: Path, key: bytes, order: Sequence[tuple[str, I8Weight]]) -> int:
    """Write every weight of `order` (temp file + rename); its bytes, or 0 if it failed."""
    entries, sizes = _layout(order)
    index = json.dumps({"weights": entries, "regions": sizes}).encode()
    temp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=".building-", suffix=".tmp", dir=path.parent)
        with os.fdopen(handle, "w+b") as out:
            out.write(HEADER.pack(MAGIC, FORMAT_VERSION, key, len(index)).ljust(PAGE, b"\0"))
            out.write(index.ljust(_aligned(len(index)), b"\0"))
            start = out.tell()
            for region in range(len(FIELDS)):
                done = 0
                for _, w in order:
                    array = _arrays(w)[region]
                    if array is not None:
                        out.write(np.ascontiguousarray(array).data)
                        done += array.nbytes
                out.write(b"\0" * (sizes[region] - done))
            out.flush()
            with mmap.mmap(out.fileno(), 0, prot=mmap.PROT_READ) as mapped:
                crc = _sample_crc(memoryview(mapped)[start:])
            out.seek(0, os.SEEK_END)
            out.write(FOOTER.pack(FOOTER_MAGIC, key, zlib.crc32(index), crc))
            total = out.tell()
        weight_cache.install(temp, path)
        temp = None
        return total
    except Exception as error:  # noqa: BLE001 - an unwritable cache: the model is built anyway
        log.debug("int8 weight cache %s not written: %s", path, error)
        return 0
    finally:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def _read(path: Path, key: bytes) -> dict[str, I8Weight]:
    """The weights of a valid file, as views of its read-only mapping; {} if it is absent or
    does not match (wrong key, size, index or sampled CRC)."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return {}
    try:
        size = os.fstat(handle).st_size
        if size < PAGE + FOOTER.size:
            return {}
        mapped = mmap.mmap(handle, 0, flags=weight_cache.MAP_FLAGS, prot=mmap.PROT_READ)
    finally:
        os.close(handle)
    whole = np.frombuffer(mapped, np.uint8)
    magic, version, stored, index_bytes = HEADER.unpack_from(mapped, 0)
    if (magic, version, stored) != (MAGIC, FORMAT_VERSION, key) or index_bytes > size:
        log.debug("int8 weight cache %s is stale, rebuilding", path)
        return {}
    raw = bytes(mapped[PAGE : PAGE + index_bytes])
    tail_magic, tail_key, index_crc, crc = FOOTER.unpack_from(mapped, size - FOOTER.size)
    if (tail_magic, tail_key, index_crc) != (FOOTER_MAGIC, key, zlib.crc32(raw)):
        log.debug("int8 weight cache %s is damaged, rebuilding", path)
        return {}
    index = json.loads(raw)
    start = PAGE + _aligned(index_bytes)
    bases = np.cumsum([start] + index["regions"])
    if int(bases[-1]) + FOOTER.size != size or \
            crc != _sample_crc(memoryview(mapped)[start : int(bases[-1])]):
        log.debug("int8 weight cache %s has the wrong size or contents, rebuilding", path)
        return {}
    weights = {}
    for entry in index["weights"]:
        arrays = {}
        for region, field in enumerate(FIELDS):
            if field in entry:
                offset, dtype, shape = entry[field]
                first = int(bases[region]) + offset
                count = int(np.prod(shape)) * np.dtype(dtype).itemsize
                arrays[field] = whole[first : first + count].view(dtype).reshape(shape)
        weights[entry["name"]] = I8Weight(entry["n_out"], entry["k_in"], entry["bits"],
                                          arrays["data"], arrays["scale"],
                                          arrays.get("offset"))
    return weights
