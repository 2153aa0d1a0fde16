"""Every benchmark entry point of `needlepoint-bench` (bench/pyproject.toml) runs for a few
seconds on the toy model (or a tiny fixture), without its peer (needle-rs, llama.cpp,
bfcl-eval, a Ray cluster): the mode each benchmark has for that (issue 27 item 6). The
console scripts are the installed ones (`scripts/test` installs bench/); each runs in its
own folder, which is where a benchmark writes its reports and results.

What each check holds is what the run must have produced, not a speed: figures are
benchmarks' business, never a test's (COMMON rules)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO_ROOT, shared_dir


def _toy() -> str:
    return str(shared_dir() / "models" / "needle3-toy.cact")


def _llama_tiny() -> str:
    return str(shared_dir() / "fixtures" / "hf" / "llama-tiny")


def _check_run(folder: Path, out: str) -> None:
    result = json.loads((folder / "out.json").read_text())
    assert result["engines"] == ["needlepoint-deploy"]  # --no-peer: no needle-rs
    ours = result["timing"]["summary"]["1"]["needlepoint-deploy"]
    assert ours["available"] and ours["error"] is None
    assert set(ours["workloads"]) >= {"prefill:len16", "decode"} or any(
        w.startswith("decode") for w in ours["workloads"])


def _check_speculate(folder: Path, out: str) -> None:
    assert "| on | 2 |" in out and "| off | 2 |" in out and "| 2/2 |" in out
    assert "toy (d 128, 4 layers, vocab 1024)" in out
    assert not (folder / "bench").exists()  # --no-write


def _check_batch_engine(folder: Path, out: str) -> None:
    toy = json.loads(out)["toy"]
    assert set(toy["step_ms"]) == {"1", "2", "4"} and len(toy["scheduler_rounds"]) == 1
    assert toy["scheduler_rounds"][0]["one"] > 0 and toy["scheduler_rounds"][0]["many"] > 0


def _check_load(folder: Path, out: str) -> None:
    result = json.loads((folder / "bench" / "results" / "load_toy.json").read_text())
    runs = result["phases"]["scaling"]["runs"]
    assert [run["clients"] for run in runs] == [1, 2]
    assert all(run["requests"] > 0 and not run["errors"] for run in runs)


def _check_hf(folder: Path, out: str) -> None:
    record = json.loads((folder / "hf.json").read_text())
    assert list(record["speed"]["1"]) == ["needlepoint-int8"]  # no llama.cpp
    assert record["speed"]["1"]["needlepoint-int8"]["best"]["decode_tok_s"] > 0
    assert (folder / "hf.md").read_text().strip()


def _check_hf_shapes(folder: Path, out: str) -> None:
    record = json.loads((folder / "shapes.json").read_text())
    assert record["engines"] == ["needlepoint-int8"]  # --no-peer: no llama.cpp
    assert set(record["results"]) == {"qwen3-tiny Q8_0", "qwen3-tiny Q4_K_M",
                                      "gemma3-tiny Q8_0", "gemma3-tiny Q4_K_M"}
    for result in record["results"].values():
        best = result["engines"]["needlepoint-int8"]["best"]
        assert best["decode_tok_s"] > 0 and best["prefill_tok_s"] > 0 and best["load_s"] > 0
        assert best["peak_rss_mb"] > 0 and not result["errors"]
    # the report is a section of the Markdown file, with the variant and the load average
    doc = (folder / "hf.md").read_text()
    assert doc.startswith("## Real shapes:") and "variant" in doc and "load average" in doc
    assert len(list((folder / "gguf").glob("*.gguf"))) == 4  # GGUFWriter's files, kept


def _tiny_gguf(folder: Path) -> str:
    """The qwen2-tiny fixture as a Q8_0 GGUF (`gguf.GGUFWriter`): the family of the real
    Qwen2.5 file, small enough for a smoke run; the real files are never used in tests."""
    from gguf_family_helpers import write_family_gguf

    return str(write_family_gguf("qwen2-tiny", folder / "tiny.gguf", "Q8_0"))


def _fidelity_rows(length: int) -> int:
    """Positions compared in a prompt of `length` tokens: 0, 32, 64, ... and the last."""
    return (length - 1) // 32 + 1 + (1 if (length - 1) % 32 else 0)


def _check_hf_real(folder: Path, out: str) -> None:
    record = json.loads((folder / "real.json").read_text())
    assert record["engines"] == ["needlepoint-float", "needlepoint-int8"]  # --no-peer
    assert record["baseline"] == "needlepoint-float" and record["machine"]["native_variant"]
    assert len(record["load_average"]["start"]) == 3
    (result,) = record["results"].values()
    assert not result["errors"] and result["prompt_tokens"] == 40
    assert result["decode_tokens"] == 4
    for threads in ("1", "2"):
        engines = result["speed"][threads]
        assert set(engines) == {"needlepoint-float", "needlepoint-int8"}
        for entry in engines.values():
            rounds, best = entry["rounds"], entry["best"]
            assert len(rounds) == 1 and rounds[0]["peak_rss_mb"] > 0  # ru_maxrss of the child
            assert best["decode_tok_s"] == max(r["decode_tok_s"] for r in rounds)
            assert best["load_s"] == min(r["load_s"] for r in rounds)
        base, ours = (engines[e]["best"] for e in ("needlepoint-float", "needlepoint-int8"))
        ratios = engines["needlepoint-int8"]["x_needlepoint-float"]
        for key in ("prefill_tok_s", "decode_tok_s", "peak_rss_mb", "load_s"):
            assert ratios[key] == pytest.approx(ours[key] / base[key], rel=1e-12)
    for entry in result["cold_load"].values():  # measured at the first thread count only
        (cold,) = entry["rounds"]
        assert cold["dropped"] is True and "resident_before" in cold and cold["load_s"] > 0
    assert set(result["fidelity"]) == {"int8 vs float"}  # no llama.cpp
    fid = result["fidelity"]["int8 vs float"]
    lengths = result["fidelity_prompts"]
    assert set(lengths) == {"prose", "code", "tool call", "technical"}
    assert fid["positions"] == sum(_fidelity_rows(n) for n in lengths.values())
    assert 0 <= fid["mean_abs_diff"] <= fid["max_abs_diff"] and 0 <= fid["top1_agreement"] <= 1
    assert fid["max_abs_diff"] == max(p["max_abs_diff"] for p in fid["per_prompt"].values())
    doc = (folder / "hf.md").read_text()
    assert doc.startswith("## Real files:") and "variant" in doc and "load average" in doc
    assert "| tiny | needlepoint-int8 |" in doc and "int8 vs float" in doc


def _check_build_peers(folder: Path, out: str) -> None:
    assert "llama-cpp-python: " in out and "llama-server: " in out
    assert out.count("-mno-amx-tile -mno-amx-int8 -mno-amx-bf16") == 2
    assert "-DLLAMA_BUILD_SERVER=ON" in out and "-j 1" in out


def _check_bfcl(folder: Path, out: str) -> None:
    report = json.loads((folder / "bfcl.json").read_text())
    (category,) = report["categories"]
    assert category["category"] == "sample" and category["cases"] == 2
    assert set(category["summary"]) == {"needlepoint-auto", "needlepoint-required"}
    # the sample's answers are in the queries (Paris, 07:30): the toy model gets them
    assert category["summary"]["needlepoint-required"]["correct"] == 2


def _check_bfcl_report(folder: Path, out: str) -> None:
    assert "| sample | 2 | needlepoint-required | 2 | 100% |" in out


def _check_products(folder: Path, out: str) -> None:
    """Every storage width of the archive measured, the total their sum (weights, bytes),
    each width's bytes those of its packed codes, and a printed line per width and total."""
    result = json.loads((folder / "p.json").read_text())
    widths = dict(result["rows"]["1"])
    total = widths.pop("total")
    assert widths and all(name.endswith("-bit") for name in widths), widths
    for key in ("weights", "bytes"):
        assert total[key] == sum(entry[key] for entry in widths.values()) > 0, key
    for name, entry in widths.items():
        bits = int(name.removesuffix("-bit"))
        assert entry["weights"] * bits <= entry["bytes"] * 8 < entry["weights"] * bits * 2
    for name in [*widths, "total"]:
        assert f"rows    1 {name:>6}:" in out, name


def _check_products_i8(folder: Path, out: str) -> None:
    assert "rows   1:" in out and "ns/weight-row" in out


def _check_stages(folder: Path, out: str) -> None:
    result = json.loads(out[out.index("\n{") + 1:])  # after the per-round lines
    assert set(result) >= {"one", "local/1", "local/2", "variant", "load_average"}
    assert all(result[k]["prefill_tps"] > 0 for k in ("one", "local/1", "local/2"))


def _check_pool(folder: Path, out: str) -> None:
    result = json.loads((folder / "pool.json").read_text())
    after = result["trees"]["after"]["by_threads"]["1"]
    assert after["variant"] and after["decode_token"]["wall_ms"] > 0
    # each step ran its sessions: one row of logits per session
    assert (after["step_1"]["rows"], after["step_16"]["rows"]) == (1, 16)
    assert after["step_16"]["wall_ms"] > 0 and after["step_1"]["wall_ms"] > 0
    page = (folder / "pool.md").read_text()
    assert "run_batch step, 16 sessions" in page and "SIMD streams" in page


# entry point -> (arguments, check of its folder and stdout, seconds it may take at most)
CASES: dict[str, tuple[Callable[[Path], list[str]], Callable[[Path, str], None], int]] = {
    "needlepoint-bench": (
        lambda d: ["--quick", "--archive", _toy(), "--no-peer", "--engines",
                   "needlepoint-deploy", "--reps", "1", "--threads", "1", "--lengths", "16",
                   "--new-tokens", "4", "--budget-s", "5", "--out", str(d / "out.json"),
                   "--no-docs"], _check_run, 300),
    "needlepoint-bench-speculate": (
        lambda d: ["--limit", "2", "--warmup", "0", "--repeat", "1", "--reps", "1",
                   "--cost-models", "toy", "--no-write"], _check_speculate, 300),
    "needlepoint-bench-batch-engine": (
        lambda d: ["--models", "toy", "--clients", "2", "--rounds", "1", "--seconds", "1",
                   "--max-new", "4"], _check_batch_engine, 300),
    "needlepoint-bench-load": (
        lambda d: ["--model", "toy", "--phases", "scaling", "--scale-clients", "2",
                   "--scale-duration", "2", "--rounds", "1", "--max-tokens", "4", "--out",
                   "-"], _check_load, 300),
    "needlepoint-bench-hf": (
        lambda d: ["--gguf", _llama_tiny(), "--engines", "needlepoint-int8", "--threads", "1",
                   "--rounds", "1", "--reps", "1", "--decode", "4", "--out", str(d / "hf.md"),
                   "--json", str(d / "hf.json")], _check_hf, 300),
    "needlepoint-bench-hf-shapes": (
        lambda d: ["--models", "qwen3-tiny", "gemma3-tiny", "--no-peer", "--prompt", "40",
                   "--decode", "3", "--reps", "1", "--rounds", "1", "--gguf-dir",
                   str(d / "gguf"), "--out", str(d / "hf.md"), "--json", str(d / "shapes.json")],
        _check_hf_shapes, 300),
    "needlepoint-bench-hf-real": (
        lambda d: ["--gguf", f"tiny={_tiny_gguf(d)}", "--no-peer", "--baseline",
                   "needlepoint-float", "--quick", "--threads", "1", "2", "--prompt", "40",
                   "--decode", "4", "--out", str(d / "hf.md"), "--json", str(d / "real.json")],
        _check_hf_real, 300),
    "needlepoint-bench-build-peers": (
        lambda d: ["--check", "--cache", str(d / "cache")], _check_build_peers, 60),
    "needlepoint-bench-bfcl": (
        lambda d: ["--model", _toy(), "--category", "sample", "--no-peer", "--out",
                   str(d / "bfcl.json")], _check_bfcl, 300),
    "needlepoint-bench-products": (
        lambda d: [_toy(), "--rows", "1", "--reps", "1", "--json", str(d / "p.json")],
        _check_products, 300),
    "needlepoint-bench-products-i8": (
        lambda d: ["--gguf", _llama_tiny(), "--rows", "1", "--reps", "1"], _check_products_i8,
        300),
    "needlepoint-bench-stages": (
        lambda d: ["--local-only", "--model", _toy(), "--prefill", "32", "--decode", "4",
                   "--repeats", "1"], _check_stages, 300),
    "needlepoint-bench-pool": (
        lambda d: ["--archive", _toy(), "--rounds", "1", "--threads", "1", "--simd-seconds",
                   "0.05", "--out", str(d / "pool.md"), "--json", str(d / "pool.json")],
        _check_pool, 300),
}


def script(name: str) -> str:
    """The installed console script (beside this interpreter, else on PATH)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/test (it installs bench/)")
    return found


def run(name: str, folder: Path) -> str:
    make_args, _, timeout = CASES[name]
    env = dict(os.environ, NEEDLEPOINT_SHARED=str(shared_dir()), NEEDLEPOINT_CACHE="0",
               OMP_NUM_THREADS="1")
    done = subprocess.run([script(name), *make_args(folder)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_entry_point_has_a_smoke_run() -> None:
    scripts = tomllib.loads((REPO_ROOT / "bench" / "pyproject.toml").read_text())
    # the BFCL report scripts read a run's results: test_bfcl_serve_scripts.py runs them
    assert set(scripts["project"]["scripts"]) == set(CASES) | {
        "needlepoint-bench-bfcl-report", "needlepoint-bench-bfcl-serve-report",
        "needlepoint-bench-bfcl-calibration"}


@pytest.mark.parametrize("name", CASES)
def test_entry_point_runs_without_its_peer(name: str, tmp_path: Path) -> None:
    out = run(name, tmp_path)
    CASES[name][1](tmp_path, out)


def test_bfcl_report_tables_a_bfcl_run(tmp_path: Path) -> None:
    run("needlepoint-bench-bfcl", tmp_path)
    done = subprocess.run([script("needlepoint-bench-bfcl-report"), str(tmp_path / "bfcl.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    _check_bfcl_report(tmp_path, done.stdout)
