"""The pure parts of `needlepoint-bench-hf-real`: the ratios, the fidelity rows and figures,
and the report's before/after table, on hand-made numbers (the smoke run covers the
measuring path on a tiny GGUF)."""

from __future__ import annotations

import numpy as np
import pytest
from needlepoint_bench.hf_real import best_of, ratios
from needlepoint_bench.hf_real_report import report
from needlepoint_bench.hf_real_worker import compare, rows


def test_fidelity_rows_are_every_32nd_position_and_the_last() -> None:
    assert rows(1) == [0]
    assert rows(33) == [0, 32]
    assert rows(34) == [0, 32, 33]
    assert rows(100) == [0, 32, 64, 96, 99]


def test_compare_pools_prompts_by_position() -> None:
    ours = {"a": np.array([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]]), "b": np.array([[1.0, 0.0, 0.0]])}
    ref = {"a": np.array([[0.0, 1.0, 1.0], [0.0, 3.0, 0.0]]), "b": np.array([[1.0, 0.0, 0.5]]),
           "only here": np.zeros((1, 3))}
    got = compare(ours, ref)
    # |diff| rows: a0 (0, 1, 0), a1 (5, 3, 0), b0 (0, 0, 0.5); argmax agrees on a0 and b0
    assert got["positions"] == 3 and set(got["per_prompt"]) == {"a", "b"}
    assert got["max_abs_diff"] == 5.0
    assert got["mean_abs_diff"] == pytest.approx(9.5 / 9)
    assert got["top1_agreement"] == pytest.approx(2 / 3)
    assert got["per_prompt"]["a"]["top1_agreement"] == 0.5


def test_ratios_and_best_of_rounds() -> None:
    rounds = [{"prefill_tok_s": 100.0, "decode_tok_s": 10.0, "peak_rss_mb": 700.0,
               "vmhwm_mb": 690.0, "load_s": 2.0, "first_token_s": 0.2},
              {"prefill_tok_s": 80.0, "decode_tok_s": 12.0, "peak_rss_mb": 650.0,
               "vmhwm_mb": 640.0, "load_s": 3.0, "first_token_s": 0.1}]
    best = best_of(rounds)
    assert best == {"prefill_tok_s": 100.0, "decode_tok_s": 12.0, "peak_rss_mb": 650.0,
                    "vmhwm_mb": 640.0, "load_s": 2.0, "first_token_s": 0.1}
    base = {"prefill_tok_s": 50.0, "decode_tok_s": 4.0, "peak_rss_mb": 325.0, "load_s": 0.5}
    assert ratios(best, base) == {"prefill_tok_s": 2.0, "decode_tok_s": 3.0,
                                  "peak_rss_mb": 2.0, "load_s": 4.0}


def _record(prefill: float, decode: float, started: str) -> dict:
    base = {"prefill_tok_s": 50.0, "decode_tok_s": 10.0, "peak_rss_mb": 400.0, "load_s": 1.0,
            "first_token_s": 0.1}
    ours = {"prefill_tok_s": prefill, "decode_tok_s": decode, "peak_rss_mb": 800.0,
            "load_s": 4.0, "first_token_s": 0.1}
    speed = {"llama.cpp": {"best": base, "rounds": [], "x_llama.cpp": ratios(base, base)},
             "needlepoint-int8": {"best": ours, "rounds": [],
                                  "x_llama.cpp": ratios(ours, base)}}
    return {"engines": ["llama.cpp", "needlepoint-int8"], "baseline": "llama.cpp",
            "threads": [1], "rounds": 1, "reps": 1, "quick": True, "prompt_tokens": 256,
            "decode_tokens": 32, "started": started, "wall_s": 10.0,
            "machine": {"cpu": "Test CPU", "native_variant": "avx2", "git": started[-4:]},
            "load_average": {"start": [1.0, 2.0, 3.0], "end": [1.5, 2.0, 3.0]},
            "results": {"qwen": {"speed": {"1": speed}, "fidelity": {}, "errors": {}}}}


def test_report_puts_a_before_run_beside_this_one() -> None:
    text = report(_record(150.0, 25.0, "after 0002"), _record(100.0, 20.0, "before 0001"))
    assert "### Before and after" in text and "Test CPU" in text and "avx2 variant" in text
    assert "1.00, 2.00, 3.00" in text  # the load average at the start
    assert ("| qwen | needlepoint-int8 | 1 | 4.00 (4.00x) | 4.00 (4.00x) | 800 (2.00x) | "
            "800 (2.00x) | 100.0 (2.00x) | 150.0 (3.00x) | 20.0 (2.00x) | 25.0 (2.50x) |"
            ) in text
    assert "### Before and after" not in report(_record(150.0, 25.0, "after 0002"))
