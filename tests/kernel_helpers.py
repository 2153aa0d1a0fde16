"""What the kernel tests share: the native library as a pytest fixture (request `lib`), and
a check run in a fresh process per SIMD variant (`variant_results`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
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


KERNEL_TESTS = Path(__file__).resolve().parent / "kernels"


def variant_results(cap: str, module: str, call: str) -> dict:
    """`module.call` (a module of tests/kernels) run in a fresh process with the C library's
    variant capped at `cap` ("best": no cap), as the dict it prints (the library picks its
    variant once per process); the process must exit 0."""
    script = (
        f"import json, sys; sys.path.insert(0, {str(KERNEL_TESTS)!r}); "
        f"sys.path.insert(0, {str(KERNEL_TESTS.parent)!r}); "
        f"import {module} as t; print(json.dumps(t.{call}))"
    )
    env = dict(os.environ)
    env.pop("NEEDLEPOINT_NATIVE_VARIANT", None)
    env.pop("NEEDLEPOINT_NATIVE", None)  # these check the native kernels, whatever this run uses
    if cap != "best":
        env["NEEDLEPOINT_NATIVE_VARIANT"] = cap
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
