"""The `.cact` reader under fuzzing: mutated and truncated tiny archives either raise a
`CactFormatError` naming a byte offset or open and decode completely.
Shared setup: `cact_helpers.py`."""

from __future__ import annotations

import re
import struct

from cact_helpers import OFFSET_RE, directory_start, tiny_bytes, touch_everything
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from needlepoint import CactFormatError, open_archive
from needlepoint.formats.cact import RECORD_BYTES, CactArchive

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
