"""The threshold fit of `needlepoint_bench.bfcl_threshold` on hand-made answers: a declined
call is right on live_irrelevance and wrong elsewhere, the candidates are 0 and the midpoints
between call probabilities, and a threshold ships only if it beats none; the committed fit
(bench/results/bfcl_threshold_fit.json) ships none, as `AUTO_CALL_THRESHOLD` says; held-out
confidences published through a Platt map are read back as raw evidence."""

from __future__ import annotations

import json

import pytest
from conftest import REPO_ROOT
from needlepoint_bench.bfcl_calibration import raw_of
from needlepoint_bench.bfcl_threshold import fit, scored

from needlepoint.generation.answer_grammar import AUTO_CALL_THRESHOLD


def row(category: str, p_call: float | None, right: bool, called: bool = True) -> dict:
    return {"category": category, "p_call": p_call, "right": right, "called": called}


ROWS = [row("live_simple", 0.8, True), row("live_simple", 0.3, False),
        row("live_irrelevance", 0.4, False), row("live_irrelevance", 0.9, True, called=False),
        row("live_relevance", 0.6, True)]


def test_a_declined_call_is_text():
    assert scored(ROWS, 0.0)["right"] == 3
    # 0.35: the 0.3 call (wrong, live_simple) is declined: still wrong
    assert scored(ROWS, 0.35)["right"] == 3
    # 0.5: the 0.4 irrelevance call is declined: now right
    assert scored(ROWS, 0.5)["per_category"]["live_irrelevance"] == {"right": 2, "n": 2}
    # 0.7: the 0.6 relevance call is declined: now wrong
    assert scored(ROWS, 0.7)["right"] == 3


def test_the_fit_ships_the_best_threshold_only_if_it_beats_none():
    result = fit(ROWS)
    thresholds = [s["threshold"] for s in result["scores"]]
    assert thresholds[:4] == pytest.approx([0.0, 0.15, 0.35, 0.5])
    assert result["best"]["threshold"] == pytest.approx(0.5) and result["best"]["right"] == 4
    assert result["shipped"] == pytest.approx(0.5)
    assert fit([row("live_simple", 0.8, True), row("live_irrelevance", 0.9, False)])[
        "shipped"] is None  # declining the wrong call costs the right one below it


def test_the_committed_fit_ships_no_threshold():
    committed = json.loads((REPO_ROOT / "bench" / "results" /
                            "bfcl_threshold_fit.json").read_text())
    assert all(r["category"].startswith("live_") for r in committed["rows"])
    assert fit(committed["rows"])["shipped"] is None and AUTO_CALL_THRESHOLD is None


def test_a_published_confidence_is_read_back_as_raw_evidence():
    used = {"slope": 0.5, "offset": 0.0}  # odds square-rooted: raw 0.9 (9:1) -> 0.75 (3:1)
    assert raw_of(0.75, used) == pytest.approx(0.9)
    assert raw_of(0.75, {"slope": 1.0, "offset": 0.0}) == 0.75 and raw_of(0.75, None) == 0.75
    assert raw_of(1.0, used) == 1.0
