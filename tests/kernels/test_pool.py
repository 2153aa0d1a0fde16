"""The native library's worker pool (`kernels/native/np_pool.h`, issue 26 item 3): a product
split between threads gives the one-thread bits, repeated calls reuse the parked workers (no
thread is started per call), and calls from two Python threads at once (one finds the pool
busy and runs alone) both give the reference bits."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from needlepoint.kernels import i8, i8_native

F32 = np.float32


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture(scope="module")
def product():
    assert i8_native.LIBRARY is not None, i8_native.UNAVAILABLE_REASON
    rng = np.random.default_rng(26)
    n, k = 1024, 1024  # 4 rows x 1024 x 1024: above the one-thread threshold (2^20)
    codes, scale = i8.quantize_weight(rng.standard_normal((n, k)).astype(F32))
    w = i8.pack_weight(codes, scale, n_out=n, k_in=k)
    x = (rng.standard_normal((4, k)) * 3).astype(F32)
    q = i8.quantize(x, w.k_pad)
    return w, q, i8.matmul_reference(*q, w, None)


def test_threads_reuse_parked_workers_and_keep_the_bits(product) -> None:
    w, q, ref = product
    w.threads = 1
    np.testing.assert_array_equal(i8.matmul(*q, w, None), ref)
    before = _os_threads()
    w.threads = 3
    np.testing.assert_array_equal(i8.matmul(*q, w, None), ref)
    started = _os_threads()
    assert started <= before + 2  # two workers for three ranges (or fewer: already there)
    for _ in range(20):
        np.testing.assert_array_equal(i8.matmul(*q, w, None), ref)
    assert _os_threads() == started  # the same workers: none started per call
    w.threads = 1


def test_two_callers_at_once_both_get_the_bits(product) -> None:
    w, q, ref = product
    w.threads = 2
    results: list[bool] = []

    def call() -> None:
        for _ in range(10):
            results.append(bool(np.array_equal(i8.matmul(*q, w, None), ref)))

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=120)
    w.threads = 1
    assert not any(caller.is_alive() for caller in callers)
    assert results == [True] * 20
