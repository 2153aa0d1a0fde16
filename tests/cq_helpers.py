"""The native-vs-reference harness of the exact CQ kernel tests (tests/kernels/test_cq_*.py):
each kernel pick against `exact.cq_matmul_reference`, the layout copy present and absent, 1
and 3 threads, and row windows that start and end inside 16-row blocks, in the calling
process's variant (the tests run it in a fresh process per variant: `variant_results`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from needlepoint.kernels import exact, native

F32 = np.float32
Window = tuple[int, int, int]  # first output row, end row, kernel pick


def window_product(m: exact.ExactMatrix, v: np.ndarray, scale: np.ndarray, lo: int, hi: int
                   ) -> np.ndarray:
    """Output columns [lo, hi) of `m` by `np_cq_matmul` with that row range (a thread's
    share, which may start and end inside a 16-row block), the rest NaN."""
    out = np.full((v.shape[0], m.out), np.nan, F32)
    status = native.LIBRARY.np_cq_matmul(
        v.ctypes.data, scale.ctypes.data, v.shape[0], m.in_pad, m.storage_bits,
        m.codebook.ctypes.data, m.codebook.size, m.c_parts(), len(m.parts), out.ctypes.data,
        m.out, lo, hi)
    assert status == 0
    return out


def pick_results(cases: Iterable[tuple], picks: tuple[int, ...],
                 windows: Callable[[exact.ExactMatrix], list[Window]]) -> dict:
    """{case: equal} for each (name, matrix, v, scale) of `cases`: every pick of `picks` on
    the whole product, and each (lo, hi, pick) of `windows(matrix)` alone (columns outside
    it left NaN), the layout copy present and absent, 1 and 3 threads."""
    results: dict = {"variant": native.simd_variant()}
    for name, m, v, scale in cases:
        want = exact.cq_matmul(v, scale, m, use_native=False)
        for copy in (True, False):
            laid = exact.with_layout(m, copy)
            for threads in (1, 3):
                split = exact.ExactMatrix(laid.cols, laid.in_pad, laid.out, laid.storage_bits,
                                          laid.codebook, laid.parts, threads)
                for pick in picks:
                    native.LIBRARY.np_cq_kernel(pick)
                    got = exact.cq_matmul(v, scale, split, use_native=True)
                    results[f"{name}-copy{int(copy)}-th{threads}-pick{pick}"] = bool(
                        np.array_equal(got, want) and np.isfinite(want).all())
            for lo, hi, pick in windows(m):
                native.LIBRARY.np_cq_kernel(pick)
                got = window_product(laid, v, scale, lo, hi)
                results[f"{name}-copy{int(copy)}-rows{lo}:{hi}-pick{pick}"] = bool(
                    np.array_equal(got[:, lo:hi], want[:, lo:hi])
                    and np.isnan(got[:, :lo]).all() and np.isnan(got[:, hi:]).all())
    native.LIBRARY.np_cq_kernel(0)
    return results


def expected_variant(cap: str, has_avx2: bool, has_vnni: bool) -> str:
    """The variant a fresh process runs with NEEDLEPOINT_NATIVE_VARIANT capped at `cap`."""
    if cap == "0":
        return "baseline"
    avx2 = "avx2+fma" if has_avx2 else "baseline"
    if cap == "1":
        return avx2
    return "avx512vnni" if has_vnni else avx2
