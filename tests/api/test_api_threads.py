"""`threads=` (issue 11): `Needle(threads=N)`, `needlepoint.load(threads=N)`, `--threads` on the
CLI, and the BLAS pools capped to it; bad values are clear errors; the answer does not depend
on the thread count."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO_ROOT, toy_model_path
from threadpoolctl import threadpool_info

import needlepoint
from needlepoint.cli import main
from needlepoint.models.hub import ModelCache

TOOLS = REPO_ROOT / "examples" / "tools.json"


def test_needle_threads_reach_the_model_and_cap_blas():
    two = needlepoint.Needle(model=toy_model_path(), threads=2, cache=ModelCache())
    assert two.model.threads == 2
    assert all(pool["num_threads"] <= 2 for pool in threadpool_info())
    one = needlepoint.Needle(model=toy_model_path(), threads=1, cache=ModelCache())
    assert one.model.threads == 1
    assert all(pool["num_threads"] == 1 for pool in threadpool_info())
    query = "wake me up at 06:45"
    # the same bits, not merely the same calls: a reduction split over threads would change
    # low bits long before it changed a call
    ids = two.prompt_ids(query)
    assert np.array_equal(two.model.forward(ids).view(np.uint32),
                          one.model.forward(ids).view(np.uint32))
    answers = [needle.complete(query) for needle in (two, one)]
    assert answers[0]["function_calls"] == answers[1]["function_calls"]
    assert np.float64(answers[0]["confidence"]).view(np.uint64) == \
        np.float64(answers[1]["confidence"]).view(np.uint64)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_thread_counts_are_value_errors(bad):
    with pytest.raises(ValueError, match="threads"):
        needlepoint.load(toy_model_path(), threads=bad)


def test_threads_from_the_environment(monkeypatch):
    monkeypatch.setenv("NEEDLEPOINT_THREADS", "2")
    assert needlepoint.load(toy_model_path()).threads == 2
    monkeypatch.setenv("NEEDLEPOINT_THREADS", "lots")
    with pytest.raises(ValueError, match="NEEDLEPOINT_THREADS"):
        needlepoint.load(toy_model_path())
    monkeypatch.delenv("NEEDLEPOINT_THREADS")
    assert needlepoint.load(toy_model_path(), threads=1).threads == 1


def test_cli_threads_flag(capsys):
    assert main(["run", "wake me up at 06:45", "--tools", str(TOOLS), "--threads", "2",
                 "--json"]) == 0
    assert "set_alarm" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "x", "--threads", "0"])
    assert exit_info.value.code == 2
