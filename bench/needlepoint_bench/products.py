"""The exact CQ x A8 products of one decode token (and of a prefill chunk), kernel only.

`needlepoint-bench-products [archive] [--rows 1,64] [--reps 7] [--json out.json]`: every deploy
product of the archive (each `needlepoint.kernels.ExactMatrix` the model loaded with deploy
numerics holds: q|k|v|gate, out, phi, MLP, engram key|value, LM head) multiplied once by a
prepared activation of `rows` rows (`kernels.a8_rotate` done outside the timing), 1 thread.
Prints, per storage width and in total: ns per weight (per weight and activation row for
rows > 1), the packed bytes streamed and the GB/s that implies, next to the machine's
measured DRAM read bandwidth (`bench.machine`), and which native variant ran
(`kernels.simd_variant()`; NEEDLEPOINT_NATIVE_VARIANT=0 / 1 caps it at the baseline / AVX2
one). Only public names (docs/api.md "Public names for clients").
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import needlepoint
from needlepoint.kernels import (
    VARIANTS,
    ExactMatrix,
    a8_rotate,
    cq_matmul,
    native_library,
    simd_variant,
)

from .machine import measure_bandwidth
from .paths import REPO_ROOT, fixture_archive
from .products_report import write_section
from .reachable import reachable

F32 = np.float32


def _matrices(path: str) -> list[ExactMatrix]:
    """The deploy products of the whole archive (every layer), as the model holds them."""
    model = needlepoint.load(path, numerics="deploy", threads=1, cache=False)
    return reachable(model, ExactMatrix)


def _time(lib: ctypes.CDLL | None, matrix: ExactMatrix, v: np.ndarray, scale: np.ndarray,
          reps: int) -> float:
    """Best seconds of one native call (arguments built once: no numpy or Python work in
    the timing beyond the ctypes call itself), or of the numpy reference without a library."""
    if lib is None:
        call = lambda: cq_matmul(v, scale, matrix)  # noqa: E731
    else:
        out = np.empty((v.shape[0], matrix.out), F32)
        first = matrix.parts[0].out_col
        args = (v.ctypes.data, scale.ctypes.data, v.shape[0], matrix.in_pad,
                matrix.storage_bits, matrix.codebook.ctypes.data, matrix.codebook.size,
                matrix.c_parts(), len(matrix.parts), out.ctypes.data - 4 * first, matrix.out, 0,
                matrix.out, 1)
        call = lambda: lib.np_cq_matmul_threads(*args)  # noqa: E731
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(lib: ctypes.CDLL | None, matrices: list[ExactMatrix], rows: int, reps: int
            ) -> dict:
    """{bits: {seconds, weights, bytes}} and the total, best of `reps` per matrix."""
    rng = np.random.default_rng(0)
    by_bits: dict[str, dict] = {}
    for m in matrices:
        x = rng.standard_normal((rows, m.cols)).astype(F32)
        v, scale = a8_rotate(x, m.in_pad, use_native=False)  # any build: same v
        seconds = _time(lib, m, v, scale, reps)
        entry = by_bits.setdefault(f"{m.storage_bits}-bit", {"seconds": 0.0, "weights": 0,
                                                             "bytes": 0})
        entry["seconds"] += seconds
        entry["weights"] += m.out * m.in_pad
        entry["bytes"] += sum(p.packed.nbytes for p in m.parts)
    total = {k: sum(e[k] for e in by_bits.values()) for k in ("seconds", "weights", "bytes")}
    by_bits["total"] = total
    for e in by_bits.values():
        e["ns_per_weight_row"] = e["seconds"] * 1e9 / (e["weights"] * rows)
        e["GB_per_s"] = e["bytes"] / e["seconds"] / 1e9
    return by_bits


def run_one(args: argparse.Namespace) -> dict:
    """Measure in this process (its library and variant); print and return the figures."""
    lib = native_library()
    variant = simd_variant()
    if args.library:  # an older build: only the signatures this bench calls
        lib = ctypes.CDLL(args.library)
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
        lib.np_simd_variant.restype = i32
        lib.np_cq_matmul_threads.argtypes = [p, p, i64, i64, i32, p, i64, p, i64, p, i64, i64,
                                             i64, i32]
        lib.np_cq_matmul_threads.restype = i32
        variant = VARIANTS[lib.np_simd_variant()]
    bandwidth = measure_bandwidth(threads=1, reps=3)
    read = bandwidth["read_GBps"]
    result = {"variant": variant, "load_average": os.getloadavg(),
              "dram_read_GBps": read, "rows": {}}
    print(f"variant {result['variant']}; load average {result['load_average']}; "
          f"DRAM read {read['median']:.1f} GB/s (best {read['best']:.1f})", flush=True)
    matrices = _matrices(args.archive)
    for rows in (int(r) for r in args.rows.split(",")):
        figures = measure(lib, matrices, rows, args.reps)
        result["rows"][str(rows)] = figures
        for name, e in figures.items():
            floor = e["bytes"] / (read["best"] * 1e9)
            print(f"rows {rows:4d} {name:>6}: {e['seconds'] * 1e3:8.3f} ms  "
                  f"{e['ns_per_weight_row']:.4f} ns/weight{'-row' if rows > 1 else ''}  "
                  f"{e['bytes'] / 1e6:6.2f} MB  {e['GB_per_s']:6.2f} GB/s  "
                  f"(x{e['seconds'] / floor:.1f} the DRAM floor)", flush=True)
    result["load_average_end"] = os.getloadavg()
    return result


def build_before(rev: str, where: Path) -> Path:
    """The native library as it was at git `rev`, built like setup.py builds it."""
    src = "src/needlepoint/kernels/native/"
    listing = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", rev, src],
                             check=True, capture_output=True, text=True).stdout.split()
    for name in listing:
        if name.endswith((".c", ".h")):
            text = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{rev}:{name}"],
                                  check=True, capture_output=True, text=True).stdout
            (where / Path(name).name).write_text(text)
    out = where / "before.so"
    subprocess.run(["gcc", "-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
                    "-fno-math-errno", "-fwrapv", str(where / "needlepoint_native.c"), "-o",
                    str(out), "-lm", "-lpthread"], check=True)
    return out


def run_docs(args: argparse.Namespace) -> None:
    """Before (git `--before`, its best variant) and after (every variant of this build), each
    in its own process, then the section of docs/benchmarks.md."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        before = build_before(args.before, Path(tmp))
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", args.before],
                             check=True, capture_output=True, text=True).stdout.strip()
        configs = [(f"before (git {rev}, float64 kernel)", str(before), None),
                   ("after", None, None), ("after", None, "1"), ("after", None, "0")]
        for label, library, cap in configs:
            out = Path(tmp) / f"run{len(runs)}.json"
            env = dict(os.environ)
            env.pop("NEEDLEPOINT_NATIVE_VARIANT", None)
            if cap is not None:
                env["NEEDLEPOINT_NATIVE_VARIANT"] = cap
            cmd = [sys.executable, "-m", "needlepoint_bench.products", args.archive,
                   "--rows", args.rows, "--reps", str(args.reps), "--json", str(out)]
            if library:
                cmd += ["--library", library]
            subprocess.run(cmd, check=True, env=env, cwd=REPO_ROOT, timeout=3000)
            runs.append((label, json.loads(out.read_text())))
    write_section(runs, args, Path(args.docs))


def archive_parser(doc: str, rows: str) -> argparse.ArgumentParser:
    """The products benchmarks' common arguments: the archive (default: the fixture), the row
    counts (`rows` by default) and a --json output file; `doc`'s first line describes it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("archive", nargs="?", default=str(fixture_archive()))
    parser.add_argument("--rows", default=rows)
    parser.add_argument("--json")
    return parser


def main() -> int:
    parser = archive_parser(__doc__, "1,64")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--library", help="another build of the native library (before/after)")
    parser.add_argument("--before", help="git revision for the before figures: with --docs")
    parser.add_argument("--docs", help="write the section into this markdown file (with "
                        "--before: before and after, every variant, each in its own process)")
    args = parser.parse_args()
    if args.docs:
        run_docs(args)
        return 0
    result = run_one(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
