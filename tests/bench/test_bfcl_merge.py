"""`needlepoint_bench.bfcl_merge`: a later run's rows replace an earlier one's for the same
(case, engine, mode), every row names its run, and confidences published through a Platt
map are stored as raw evidence."""

from __future__ import annotations

import pytest
from needlepoint_bench.bfcl_merge import merge


def row(case: str, engine: str, mode: str, right: bool, confidence: float | None) -> dict:
    return {"id": case, "category": "simple_python", "engine": engine, "mode": mode,
            "right": right, "lost": False, "unparseable": False, "seconds": 1.0,
            "confidence": confidence, "call_confidences": [confidence] if confidence else []}


def test_later_rows_replace_earlier_ones_and_name_their_run():
    old = {"model": "m", "calibration": {"slope": 1.0, "offset": 0.0},
           "rows": [row("a", "needlepoint", "forced", False, 0.2),
                    row("a", "llama.cpp", "forced", True, None),
                    row("b", "needlepoint", "auto", True, 0.6)]}
    # odds square-rooted: a published 0.75 (3:1) is raw 0.9 (9:1)
    new = {"model": "m", "calibration": {"slope": 0.5, "offset": 0.0},
           "rows": [row("a", "needlepoint", "forced", True, 0.75)]}
    merged = merge([("old.json", old), ("new.json", new)])
    by = {(r["id"], r["engine"], r["mode"]): r for r in merged["rows"]}
    assert len(merged["rows"]) == 3
    assert by[("a", "needlepoint", "forced")]["run"] == "new.json"
    assert by[("a", "needlepoint", "forced")]["right"] is True
    assert by[("a", "needlepoint", "forced")]["confidence"] == pytest.approx(0.9)
    assert by[("a", "needlepoint", "forced")]["call_confidences"] == pytest.approx([0.9])
    assert by[("a", "llama.cpp", "forced")]["run"] == "old.json"
    assert by[("b", "needlepoint", "auto")]["confidence"] == 0.6
    assert merged["calibration"] == {"slope": 1.0, "offset": 0.0}
    assert [r["run"] for r in merged["runs"]] == ["old.json", "new.json"]
    forced = next(s for s in merged["summary"]
                  if (s["engine"], s["mode"]) == ("needlepoint", "forced"))
    assert (forced["n"], forced["right"]) == (1, 1)
