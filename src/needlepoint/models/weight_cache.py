"""The prepared float32 weight matrices of a model, in one arena, cached on disk.

`v3.weights` lays every big matrix out in one float32 arena (one allocation: large enough for
the kernel to back it with huge pages, so ~200 MB of fresh memory faults in ~20 ms instead of
~100). Building it from the archive is a byte-LUT gather per weight; a cache file holds the
finished arena so later loads map it read-only instead (page-cache backed and shared between
processes): a load in milliseconds.

* Where: `$NEEDLEPOINT_CACHE_DIR`, else `$XDG_CACHE_HOME/needlepoint`, else
  `~/.cache/needlepoint`; one file per archive path and ladder rung, `<stem>-<path tag>-<key>.npw`
  (a rebuilt file replaces the older versions of the same archive path).
* Off: `NEEDLEPOINT_CACHE=0` (or `false`/`no`/`off`), or `needlepoint.load(..., cache=False)`.
  The test suite turns it off (`tests/conftest.py`); the cache tests point it at a tmp dir.
* Key: sha256 of the cache format version, the arena layout, the archive's size and mtime,
  its header + codebooks + directory bytes and a strided sample of its contents.
* Safety: written to a temp file in the cache folder and renamed into place (atomic on POSIX),
  so a reader never sees a partial file. A file is used only when its size, header (magic,
  version, key) and footer (key, CRC-32 of one 4 KiB page per MiB of payload) all match;
  anything else, or any OS error while reading or writing, means the arena is built from the
  archive as without a cache (never an exception, never a wrong arena). Not detected: a
  flipped bit outside the sampled pages of a complete, well-formed file (hashing all ~200 MB
  would cost as much as building).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import tempfile
import threading
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from ..formats.cact import CactArchive

FORMAT_VERSION = 1
MAGIC = b"NPWCACHE"
FOOTER_MAGIC = b"NPWC-END"
HEADER = struct.Struct("<8sII Q 32s")  # magic, version, float bytes, floats, key
FOOTER = struct.Struct("<8s32sI")  # magic, key, CRC-32 of the sampled pages
HEADER_BYTES = 4096  # the payload starts page-aligned
ALIGN = 16  # floats: every matrix starts 64-byte aligned
SAMPLE_STRIDE = 1 << 20
SAMPLE_BYTES = 4096
OFF = ("0", "false", "no", "off")
# read-only cache maps: populated (every page faulted in one pass, not one by one in the first
# forward) where the platform can
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
log = logging.getLogger(__name__)
_writers: list[threading.Thread] = []


def enabled(flag: bool | None = None) -> bool:
    """`flag` if given, else the `NEEDLEPOINT_CACHE` environment switch (default on)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get("NEEDLEPOINT_CACHE", "1").strip().lower() not in OFF


def cache_dir() -> Path:
    explicit = os.environ.get("NEEDLEPOINT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "needlepoint"


def layout(slots: Sequence[Any]) -> tuple[list[int], int]:
    """Float offset of each slot (`.shape` [in, out]) in the arena, and the arena's length."""
    offsets, cursor = [], 0
    for slot in slots:
        offsets.append(cursor)
        cursor += -(-int(np.prod(slot.shape)) // ALIGN) * ALIGN
    return offsets, cursor


def arena(
    archive: CactArchive,
    slots: Sequence[Any],
    fill: Callable[[Any, np.ndarray], None],
    cache: bool | None = None,
) -> dict[str, np.ndarray]:
    """Read-only views {slot.key: [in, out] matrix}: mapped from the cache file when a valid
    one exists, else built with `fill(slot, view)` (and the file written when caching is on)."""
    offsets, total = layout(slots)
    path = key = None
    if enabled(cache) and archive.path.is_file():
        try:
            described = ";".join(f"{s.key}:{s.shape}:{s.rotated}:{s.parts}" for s in slots)
            key = _key(archive, described, total)
            path = cache_dir() / _file_name(archive.path, described, key)
            data = _read(path, key, total)
        except Exception as error:  # noqa: BLE001 - a bad cache must never stop a load
            log.debug("weight cache unreadable: %s", error)
            data = None
        if data is not None:
            return _views(data, slots, offsets)
    data = np.empty(total, np.float32)
    for slot, offset in zip(slots, offsets, strict=True):
        fill(slot, data[offset : offset + int(np.prod(slot.shape))].reshape(slot.shape))
    views = _views(data, slots, offsets)
    if path is not None and key is not None:
        # written in the background (the write releases the GIL): the model is usable now.
        # Not a daemon thread: interpreter exit waits for it, so a file is finished, not cut.
        writer = threading.Thread(
            target=_write, args=(path, key, data), name="needlepoint-weight-cache"
        )
        _writers[:] = [w for w in _writers if w.is_alive()] + [writer]
        writer.start()
    return views


def flush() -> None:
    """Wait until every cache file being written in the background is in place."""
    while _writers:
        _writers.pop().join()


def _views(data: np.ndarray, slots: Sequence[Any], offsets: list[int]) -> dict[str, np.ndarray]:
    data.flags.writeable = False  # shared by every session of the model
    return {
        slot.key: data[offset : offset + int(np.prod(slot.shape))].reshape(slot.shape)
        for slot, offset in zip(slots, offsets, strict=True)
    }


# -- identity --------------------------------------------------------------------------------
def _key(archive: CactArchive, described: str, total: int) -> bytes:
    import hashlib  # here, not at import: it maps OpenSSL (~3 MB RSS) even with the cache off

    stat = os.stat(archive.path)
    digest = hashlib.sha256()
    digest.update(f"v{FORMAT_VERSION}|{np.dtype(np.float32).str}|{total}|{described}".encode())
    digest.update(struct.pack("<QQ", stat.st_size, stat.st_mtime_ns))
    digest.update(archive.span(0, archive.directory_end))
    for start in range(archive.directory_end, archive.size, SAMPLE_STRIDE):
        digest.update(archive.span(start, start + SAMPLE_BYTES))
    digest.update(archive.span(archive.size - SAMPLE_BYTES, archive.size))
    return digest.digest()


def _file_name(archive_path: Path, described: str, key: bytes) -> str:
    """`<stem>-<tag of path and layout (rung)>-<key>.npw`: one live file per tag."""
    import hashlib

    where = f"{archive_path.resolve()}|{described}"
    tag = hashlib.sha256(where.encode()).hexdigest()[:12]
    return f"{archive_path.stem}-{tag}-{key.hex()[:24]}.npw"


def _sample_crc(payload: memoryview) -> int:
    crc = 0
    for start in range(0, len(payload), SAMPLE_STRIDE):
        crc = zlib.crc32(payload[start : start + SAMPLE_BYTES], crc)
    return crc


# -- file ------------------------------------------------------------------------------------
def _read(path: Path, key: bytes, total: int) -> np.ndarray | None:
    """The cached arena, mapped read-only, or None if the file is absent or not a match."""
    payload_bytes = 4 * total
    try:
        handle = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(handle).st_size != HEADER_BYTES + payload_bytes + FOOTER.size:
            log.debug("weight cache %s: wrong size, rebuilding", path)
            return None
        mapped = mmap.mmap(handle, 0, flags=MAP_FLAGS, prot=mmap.PROT_READ)
    finally:
        os.close(handle)
    view = memoryview(mapped)
    magic, version, width, count, stored = HEADER.unpack_from(view, 0)
    end = HEADER_BYTES + payload_bytes
    tail_magic, tail_key, crc = FOOTER.unpack_from(view, end)
    payload = view[HEADER_BYTES:end]
    good = (magic, version, width, count, stored) == (MAGIC, FORMAT_VERSION, 4, total, key)
    good = good and (tail_magic, tail_key) == (FOOTER_MAGIC, key) and crc == _sample_crc(payload)
    if not good:
        log.debug("weight cache %s does not match this archive, rebuilding", path)
        payload.release()
        view.release()
        mapped.close()
        return None
    return np.frombuffer(mapped, np.float32, count=total, offset=HEADER_BYTES)


def install(temp: str | Path, path: Path) -> None:
    """Rename a finished cache file `temp` to `path` (`<stem>-<tag>-<key><suffix>`, atomic on
    POSIX) and remove the older files of the same stem and tag (another key: stale)."""
    os.replace(temp, path)
    prefix = path.name.rsplit("-", 1)[0] + "-"
    for old in path.parent.iterdir():
        if old.name.startswith(prefix) and old.suffix == path.suffix and old != path:
            old.unlink(missing_ok=True)


def _write(path: Path, key: bytes, data: np.ndarray) -> None:
    """Write the arena atomically (temp file + rename); failures are logged, never raised."""
    temp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = memoryview(data).cast("B")
        handle, temp = tempfile.mkstemp(prefix=".building-", suffix=".tmp", dir=path.parent)
        with os.fdopen(handle, "wb") as out:
            header = HEADER.pack(MAGIC, FORMAT_VERSION, 4, data.size, key)
            out.write(header.ljust(HEADER_BYTES, b"\0"))
            out.write(payload)
            out.write(FOOTER.pack(FOOTER_MAGIC, key, _sample_crc(payload)))
        install(temp, path)
        temp = None
    except Exception as error:  # noqa: BLE001 - unwritable cache: the model is built anyway
        log.debug("weight cache %s not written: %s", path, error)
    finally:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)
