"""The per-row cost curve of the exact CQ x A8 products, every 2- and 4-bit kernel A/B in one
process.

`python -m needlepoint_bench.products_curve [archive] [--rows 1,2,4,8,16,32,64] [--rounds 5]
[--docs docs/benchmarks.md]` (with --docs: the AVX2 and the best variant, each in its own
process, and the section of the markdown file, which replaces its own heading there): every
deploy product slot of the archive (as `needlepoint_bench.products`), at each activation-row
count, timed in the configurations of `CONFIGS` (the kernel pick `np_cq_kernel` and whether the
parts carry the copy of their storage layout, `kernels.with_layout`: the interleaved 2-bit codes,
the 16-row blocked 4-bit codes), alternating
call by call (best of `rounds` per matrix and configuration), so all see the same load; the time
is the calling thread's CPU time (`time.thread_time`: the 2 shared cores run other work, and
waiting for a core is not the kernel's cost). Beside them, in the same process: the time to
stream the same packed bytes (an integer sum over each part's codes and norms, CPU time, best
of `rounds`), the copies' size (per storage width) and build time, and an int8 GEMM rate
(needlepoint's own int8 tile kernel `i8.matmul`, np_i8_tile.h, on a synthetic [4096, 2048]
weight). Prints the
variant (NEEDLEPOINT_NATIVE_VARIANT caps it) and the load average at the start and the end.
ns per weight-row = seconds / (weights x rows).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from needlepoint.kernels import (
    I8_BLOCK,
    ExactMatrix,
    a8_rotate,
    i8_matmul,
    i8_pack_weight,
    i8_quantize,
    native_library,
    simd_variant,
    with_layout,
)

from .paths import REPO_ROOT
from .products import _matrices, archive_parser

F32 = np.float32
# name: (np_cq_kernel pick, layout copy present). "default" is what a deploy load runs;
# "default, no copy" is the pick without the copy; "multiply-add" the level-sum / 16-bit digit
# kernels without it (for 4-bit storage: the digit kernel, the "before" of the 4-bit column);
# "hadamard" the transform on the weights forced (np_cq_kernel 3); "lookup, one block" the
# lookups one 16-row block at a time (np_cq_kernel 5: the AVX2 form, where AVX-512 otherwise
# takes two blocks per zmm register with the copy, np_cq_lut.h np_lut_group2).
# "hadamard, transposed" the transform on the weights without the copy (codes transposed per
# call).
CONFIGS = {
    "default": (0, True),
    "default, no copy": (0, False),
    "lookup": (2, True),
    "lookup, transposed": (2, False),
    "multiply-add": (1, False),
    "hadamard": (3, True),
    "lookup, one block": (5, True),
    "hadamard, transposed": (3, False),
}
# the transform on the weights: np_cq_had.h (AVX-512 VNNI), np_cq_had2.h (AVX2); the one-block
# lookups forced: AVX-512 VNNI only (elsewhere pick 5 is pick 2)
SIMD_ONLY = ("hadamard", "hadamard, transposed")
VNNI_ONLY = ("lookup, one block",)


def configs() -> dict:
    """`CONFIGS` this process's variant runs (on the baseline pick 3 is the default pick,
    below AVX-512 VNNI pick 5 is pick 2)."""
    variant = simd_variant()
    return {k: c for k, c in CONFIGS.items()
            if (variant != "baseline" or k not in SIMD_ONLY)
            and (variant == "avx512vnni" or k not in VNNI_ONLY)}


HEADING = "## Exact CQ x A8 products: the per-row cost curve"
NOTES_FILE = Path(__file__).with_name("products_curve_notes.md")


def _call(matrix: ExactMatrix, v: np.ndarray, scale: np.ndarray):
    """The native call with its arguments built once (as `needlepoint_bench.products._time`)."""
    lib = native_library()
    out = np.empty((v.shape[0], matrix.out), F32)
    first = matrix.parts[0].out_col
    args = (v.ctypes.data, scale.ctypes.data, v.shape[0], matrix.in_pad, matrix.storage_bits,
            matrix.codebook.ctypes.data, matrix.codebook.size, matrix.c_parts(),
            len(matrix.parts), out.ctypes.data - 4 * first, matrix.out, 0, matrix.out, 1)
    return lambda: lib.np_cq_matmul_threads(*args), out


def layouts(matrices: list[ExactMatrix]) -> dict:
    """{True: the matrices with the layout copy, False: without}, the copies' bytes (in all
    and per storage width) and build seconds (CPU time)."""
    t0 = time.thread_time()
    with_copy = [with_layout(m, True) for m in matrices]
    seconds = time.thread_time() - t0
    by_bits: dict = {}
    for m in with_copy:
        for p in m.parts:
            if p.interleaved is not None:
                key = f"{m.storage_bits}-bit"
                by_bits[key] = by_bits.get(key, 0) + p.interleaved.nbytes
    return {True: with_copy, False: [with_layout(m, False) for m in matrices],
            "bytes": sum(by_bits.values()), "bytes_by_bits": by_bits, "seconds": seconds}


def curve(sets: dict, rows: int, rounds: int) -> dict:
    """{config: {bits: seconds}} at `rows` activation rows, configurations alternating per
    call; asserts their outputs are equal (same bits)."""
    rng = np.random.default_rng(rows)
    lib = native_library()
    run = configs()
    best: dict = {k: {} for k in run}
    for i, m in enumerate(sets[False]):
        x = rng.standard_normal((rows, m.cols)).astype(F32)
        v, scale = a8_rotate(x, m.in_pad)
        calls = {name: _call(sets[copy][i], v, scale) for name, (_, copy) in run.items()}
        key = f"{m.storage_bits}-bit"
        seen = {}
        for _ in range(rounds):
            for name, (pick, _) in run.items():
                call, out = calls[name]
                lib.np_cq_kernel(pick)
                t0 = time.thread_time()
                call()
                dt = time.thread_time() - t0
                best[name][(i, key)] = min(best[name].get((i, key), dt), dt)
                seen[name] = out.copy()
        if any(not np.array_equal(o, seen["default"]) for o in seen.values()):
            raise AssertionError("the kernels differ")
    lib.np_cq_kernel(0)
    summed: dict = {}
    for name, per in best.items():
        by = summed.setdefault(name, {})
        for (_, key), seconds in per.items():
            by[key] = by.get(key, 0.0) + seconds
    return summed


def stream(matrices: list[ExactMatrix], rounds: int) -> dict:
    """{bits: seconds} to read every part's packed codes and norms once (an integer sum over
    8-byte words: the bytes a product streams), best of `rounds` per matrix."""
    out: dict = {}
    for m in matrices:
        best = float("inf")
        for _ in range(rounds):
            t0 = time.thread_time()
            for p in m.parts:
                np.add.reduce(p.packed.reshape(-1).view(np.uint64))
                np.add.reduce(p.norms.reshape(-1).view(np.uint32))
            best = min(best, time.thread_time() - t0)
        key = f"{m.storage_bits}-bit"
        out[key] = out.get(key, 0.0) + best
    return out


def int8_gemm(rows: int, rounds: int, n: int = 4096, k: int = 2048) -> dict:
    """Seconds and G MAC/s of `i8.matmul` (the int8 tile kernel) for [rows, k] x [n, k]^T."""
    rng = np.random.default_rng(1)
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    w = i8_pack_weight(codes, np.ones((n, k // I8_BLOCK), F32))
    x = rng.standard_normal((rows, k)).astype(F32)
    xc, xs, sums = i8_quantize(x, w.k_pad)
    out = np.empty((rows, n), F32)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        i8_matmul(xc, xs, sums, w, None, out=out)
        best = min(best, time.thread_time() - t0)
    return {"seconds": best, "gmacs": rows * n * k / best / 1e9,
            "ns_per_weight_row": best * 1e9 / (rows * n * k)}


def main() -> int:
    parser = archive_parser(__doc__, "1,2,4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--docs", type=Path)
    args = parser.parse_args()
    if args.docs:
        return run_docs(args)
    if native_library() is None:
        raise SystemExit("the native library is not built")
    sets = layouts(_matrices(args.archive))
    weights: dict = {}
    for m in sets[False]:
        key = f"{m.storage_bits}-bit"
        weights[key] = weights.get(key, 0) + m.out * m.in_pad
    streamed = stream(sets[False], args.rounds)
    result = {"variant": simd_variant(), "cpu": _cpu(), "load_start": os.getloadavg(),
              "rows": {}, "stream": streamed, "copy_bytes": sets["bytes"],
              "copy_bytes_by_bits": sets["bytes_by_bits"], "copy_seconds": sets["seconds"]}
    print(f"variant {result['variant']} ({result['cpu']}); load average {result['load_start']}; "
          f"weights { {k: f'{w / 1e6:.1f} M' for k, w in weights.items()} }; stream "
          f"{ {k: f'{x * 1e3:.3f} ms' for k, x in streamed.items()} }; layout copies "
          f"{ {k: f'{x / 1e6:.2f} MB' for k, x in sets['bytes_by_bits'].items()} } built in "
          f"{sets['seconds'] * 1e3:.1f} ms", flush=True)
    for rows in (int(r) for r in args.rows.split(",")):
        c = curve(sets, rows, args.rounds)
        g = int8_gemm(rows, args.rounds)
        entry = {"int8_gemm": g}
        line = [f"rows {rows:3d}"]
        for name, by in c.items():
            ns = {k: s * 1e9 / (weights[k] * rows) for k, s in by.items()}
            total = sum(by.values())
            entry[name] = {"seconds": by, "ns_per_weight_row": ns, "total_ms": total * 1e3}
            line.append(f"{name}: " + " ".join(f"{k} {x:.4f}" for k, x in sorted(ns.items()))
                        + f" ({total * 1e3:.2f} ms)")
        four = {n: e["ns_per_weight_row"].get("4-bit") for n, e in entry.items()
                if n != "int8_gemm"}
        if four["default"] is not None:
            line.append(f"4-bit before {four['multiply-add']:.4f} → after {four['default']:.4f} "
                        f"({four['multiply-add'] / four['default']:.2f}x)")
        line.append(f"int8 GEMM {g['gmacs']:.1f} GMAC/s = {g['ns_per_weight_row']:.4f}")
        result["rows"][str(rows)] = entry
        print(" | ".join(line) + f" | load {os.getloadavg()[0]:.2f}", flush=True)
    result["load_end"] = os.getloadavg()
    print(f"load average at the end {result['load_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run_docs(args: argparse.Namespace) -> int:
    """The AVX2 and the best variant, each in a fresh process, then the section."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for cap in ("1", None):
            out = Path(tmp) / f"curve{len(runs)}.json"
            env = dict(os.environ)
            env.pop("NEEDLEPOINT_NATIVE_VARIANT", None)
            if cap is not None:
                env["NEEDLEPOINT_NATIVE_VARIANT"] = cap
            subprocess.run([sys.executable, "-m", "needlepoint_bench.products_curve", args.archive,
                            "--rows", args.rows, "--rounds", str(args.rounds), "--json",
                            str(out)], check=True, env=env, cwd=REPO_ROOT, timeout=3000)
            runs.append(json.loads(out.read_text()))
    write_section(args, runs)
    return 0


def _load(x: list) -> str:
    return ", ".join(f"{a:.2f}" for a in x)


def _copies(run: dict) -> str:
    by = run.get("copy_bytes_by_bits") or {"2-bit": run["copy_bytes"]}
    return ", ".join(f"{k} {x / 1e6:.2f} MB" for k, x in sorted(by.items()))


def _before(run: dict, rows: str) -> str:
    """The configuration the default pick ran before the transform on the weights and the
    two-block lookups: on AVX-512 VNNI the one-block lookups with the copy at 1 and from 16
    rows, the level sums / digits at 2-15; on AVX2 the one-block lookups with the copy."""
    if run["variant"] != "avx512vnni":
        return "lookup"
    return "lookup, one block" if int(rows) == 1 or int(rows) >= 16 else "multiply-add"


def write_section(args: argparse.Namespace, runs: list) -> None:
    """The curve tables (ns per weight-row, per variant and configuration) into `args.docs`."""
    L = [HEADING, "",
         f"_Generated by `python -m needlepoint_bench.products_curve --docs {args.docs}` on "
         f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC ({Path(args.archive).name}, "
         f"best of {args.rounds} calls per matrix and configuration, 1 thread, CPU time of the "
         f"calling thread, {runs[0]['cpu']}). Do not edit: the text lives in "
         "`bench/needlepoint_bench/products_curve.py` and `products_curve_notes.md`._", "",
         "Every deploy product of the archive at 1 to 64 activation rows, 2-bit ns per weight "
         "and activation row, the configurations alternating call by call in one process "
         "(their outputs compared equal at every call). *after*: the default pick with the "
         "layout copies a load builds; *before*: the pick before the transform on the weights "
         "and the two-block lookups (AVX-512 VNNI: *lookup, one block* at 1 and from 16 rows, "
         "*mult-add* at 2-15; AVX2: *lookup*); *lookup* / *lookup, transposed*: the lookup "
         "kernel forced, with the copy / transposing the packed codes per call (with the copy "
         "on AVX-512 two 16-row blocks per zmm register, `np_lut_group2`); *lookup, one "
         "block*: the lookups one 16-row block at a time (AVX-512 VNNI only; elsewhere it is "
         "*lookup*); *mult-add*: the level-sum / 16-bit digit kernels; *hadamard*: the "
         "transform on the weights forced (`np_cq_had.h` on AVX-512 VNNI, `np_cq_had2.h` on "
         "AVX2), *hadamard, transposed*: the same without the copy. *4-bit after*: the "
         "default pick with the 16-row blocked copy (AVX-512 VNNI: np_cq_int4.h; AVX2: the "
         "digit kernel); "
         "*4-bit before*: the 16-bit digit kernel without the copy. *all products ms*: the "
         "before column's configuration (its 4-bit products as that pick runs them) → after. "
         "*stream*: an integer sum over the same packed bytes (codes and "
         "norms, all products) in the same process; *ratio*: all products (after) / stream.",
         ""]
    for run in runs:
        st = sum(run["stream"].values())
        L += [f"**{run['variant']}** (load average {_load(run['load_start'])} → "
              f"{_load(run['load_end'])}; layout copies {_copies(run)}, "
              f"built in {run['copy_seconds'] * 1e3:.1f} ms; stream {st * 1e3:.3f} ms):", "",
              "| rows | 2-bit after | 2-bit before | lookup | lookup, one block | lookup, "
              "transposed | mult-add | hadamard | 4-bit after | 4-bit before | all products ms "
              "before → after | ratio to stream | int8 GEMM ns/weight-row |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for rows, e in run["rows"].items():
            ns = {k: e[k]["ns_per_weight_row"]["2-bit"] for k in CONFIGS if k in e}
            had = f"{ns['hadamard']:.4f}" if "hadamard" in ns else "–"
            one = f"{ns['lookup, one block']:.4f}" if "lookup, one block" in ns else "–"
            old = _before(run, rows)
            after, before = e["default"], e[old]
            L.append(f"| {rows} | **{ns['default']:.4f}** | {ns[old]:.4f} | "
                     f"{ns['lookup']:.4f} | {one} | {ns['lookup, transposed']:.4f} | "
                     f"{ns['multiply-add']:.4f} | {had} | "
                     f"**{after['ns_per_weight_row']['4-bit']:.4f}** | "
                     f"{e['multiply-add']['ns_per_weight_row']['4-bit']:.4f} | "
                     f"{before['total_ms']:.2f} → {after['total_ms']:.2f} | "
                     f"{after['total_ms'] / (st * 1e3):.1f}x | "
                     f"{e['int8_gemm']['ns_per_weight_row']:.4f} |")
        L.append("")
    notes = NOTES_FILE.read_text().strip().split("\n\n")
    L += ["\n\n".join(" ".join(p.split("\n")) for p in notes)]
    text = args.docs.read_text() if args.docs.exists() else ""
    at = text.find(HEADING)
    if at >= 0:
        rest = text[at + len(HEADING):]
        nxt = rest.find("\n## ")
        text = text[:at] + (rest[nxt + 1:] if nxt >= 0 else "")
    args.docs.write_text(text.rstrip("\n") + "\n\n" + "\n".join(L).rstrip("\n") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
