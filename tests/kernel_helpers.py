"""The native int8 library as a pytest fixture, shared by the kernel tests (request `lib`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from needlepoint.kernels import i8_native


@pytest.fixture(name="lib")
def native_lib() -> Iterator[Any]:
    """The loaded library (the test fails, never skips, without it); after the test, the
    variant is put back to the best this CPU runs."""
    assert i8_native.LIBRARY is not None, i8_native.UNAVAILABLE_REASON
    yield i8_native.LIBRARY
    i8_native.LIBRARY.np_force_variant(2)  # back to the best this CPU runs
