"""A model file's page-cache state before a load: warm (read through once) or cold (dropped
with `posix_fadvise(POSIX_FADV_DONTNEED)`), and how much of it is resident (`mincore`).

Dropping needs no privilege but is only a request: pages another process maps or has dirty
stay, and some file systems ignore it. So every cold load records the resident fraction
measured right after the drop; a cold figure is only cold where that fraction is ~0, and
`resident_fraction` returns None where `mincore` is unavailable (not Linux).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_PAGE = mmap.PAGESIZE


def warm(path: Path) -> None:
    """Read the whole file once, so its pages are in the page cache."""
    with open(path, "rb", buffering=0) as handle:
        while handle.read(1 << 24):
            pass


def drop(path: Path) -> bool:
    """Ask the kernel to drop the file's cached pages; False where posix_fadvise is missing."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped: write them first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(path: Path) -> float | None:
    """The fraction of the file's pages in the page cache (mincore over a read-only map of
    it, which itself faults nothing in); None where it cannot be measured."""
    size = os.path.getsize(path)
    if size == 0 or not hasattr(os, "posix_fadvise"):
        return None
    libc = _libc()
    if libc is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in vec) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
