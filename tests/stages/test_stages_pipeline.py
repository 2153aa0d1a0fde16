"""Pipelining across requests (`stages/pipeline.py`): `run_batch` cuts the requests into
micro-batches (one per stage by default), submits every micro-batch's chain of stage calls
before waiting for any, and each request's logits are the bits it gets alone, for any
number of micro-batches, with prompts of several chunks, on Needle 3 (stacked deploy
passes in each stage) and transformers; the scheduler's engine steps on a staged model
give every request the single-process tokens."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import toy_model_path
from hf_helpers import hf_fixture_dir
from stages_helpers import assert_bits, fixture_path, long_prompt
from test_stages_behaviour import _Recorder
from v3_helpers import model

import needlepoint
from needlepoint.stages import load_staged
from needlepoint.stages.pipeline import default_micro_batches, groups


def test_groups_cut_contiguously_and_evenly():
    assert groups(8, 2) == [range(0, 4), range(4, 8)]
    assert groups(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert groups(2, 4) == [range(0, 1), range(1, 2)]
    assert groups(5, 1) == [range(0, 5)]


def _cases(name: str):
    if name == "needle3":
        reference = model("tiny")
        prompts = [long_prompt("tiny", 60 + 23 * k)[k:] for k in range(8)]
        return fixture_path("tiny"), reference, prompts, {"cache": False}
    path = hf_fixture_dir("llama-tiny")
    reference = needlepoint.load(path, numerics="int8")
    rng = np.random.default_rng(9)
    prompts = [rng.integers(3, reference.config.vocab, 30 + 17 * k) for k in range(8)]
    return path, reference, prompts, {"numerics": "int8"}


@pytest.mark.parametrize("name", ["needle3", "transformer"])
def test_eight_requests_pipelined_are_the_bits_alone(name):
    """8 requests: prefills of different lengths (several chunks each), then 6 decode steps
    of all 8 per call, at 1, 2, 3 and 8 micro-batches: every row equals the request alone."""
    path, reference, prompts, options = _cases(name)
    expected = [reference.forward(p) for p in prompts]
    with load_staged(path, [0, 1, 3], **options) as staged:
        for micro in (None, 1, 2, 8):
            staged.micro_batches = micro
            sessions = [staged.session(chunk=32) for _ in prompts]
            heads = [p[:-6] for p in prompts]
            got = staged.run_batch([(s, h, k % 2 == 0) for k, (s, h) in
                                    enumerate(zip(sessions, heads, strict=True))])
            for k, (rows, h) in enumerate(zip(got, heads, strict=True)):
                want = expected[k][: len(h)] if k % 2 == 0 else expected[k][len(h) - 1]
                assert_bits(rows, want, f"{name} prefill {k}, micro {micro}")
            for step in range(6, 0, -1):
                got = staged.run_batch([(s, [p[-step]], False)
                                        for s, p in zip(sessions, prompts, strict=True)])
                for k, row in enumerate(got):
                    assert_bits(row, expected[k][-step], f"{name} step {k}, micro {micro}")


def test_micro_batches_are_all_in_flight_before_the_head_waits():
    """8 one-token steps on 3 stages: 3 micro-batches, each a chain of 3 `run_many` calls,
    all 9 submitted before the head waits for the first (then it reads each out in turn)."""
    prompts = [long_prompt("tiny", 20)[k:] for k in range(8)]
    with load_staged(fixture_path("tiny"), [0, 1, 3], cache=False) as staged:
        sessions = [staged.session() for _ in prompts]
        staged.run_batch([(s, p, False) for s, p in zip(sessions, prompts, strict=True)])
        staged.transport = recorder = _Recorder(staged.transport)
        staged.micro_batches = 3
        staged.run_batch([(s, [5], False) for s in sessions])
        submits = [e for e in recorder.log if e[0] == "submit"]
        assert [e[2] for e in submits] == ["run_many"] * 9
        assert [e[1] for e in submits] == [0, 1, 2] * 3
        assert recorder.log[9:] == [("gather", 1)] * 3
        assert default_micro_batches(staged, 8) == 6  # stacking stages: 2 per stage
        assert default_micro_batches(staged, 4) == 4
    with load_staged(hf_fixture_dir("llama-tiny"), 2) as staged:
        assert default_micro_batches(staged, 8) == 8  # chunk by chunk: one per request


def test_scheduler_steps_on_a_staged_model_give_the_single_process_tokens():
    """Continuous batching over a staged model: 6 concurrent Needle requests through the
    scheduler (one engine loop per stage, each stepping its share of the requests with the
    staged run_batch, so both stages work at once) return what each returns alone on one
    process."""
    import json
    import threading

    from conftest import REPO_ROOT

    from needlepoint.api.scheduler import Scheduler

    tools = json.loads((REPO_ROOT / "examples" / "tools.json").read_text())
    queries = ["wake me up at 06:45", "set a timer for 10 minutes", "play some jazz",
               "remind me to call mum", "turn off the kitchen lights", "what's the weather"]
    single = needlepoint.Needle(tools=tools, model=needlepoint.load(toy_model_path()),
                                max_new_tokens=32)
    expected = [single.complete(q)["function_calls"] for q in queries]
    with load_staged(toy_model_path(), [0, 2], cache=False) as staged:
        scheduler = Scheduler(staged, max_sessions=8)
        assert scheduler.loops == staged.pipeline_depth == 2  # one engine loop per stage
        scheduler.start()
        got: dict = {}

        def ask(k: int) -> None:
            with scheduler.lease() as lease:
                needle = needlepoint.Needle(tools=tools, model=lease.model, max_new_tokens=32)
                got[k] = needle.complete(queries[k])["function_calls"]

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(queries))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        scheduler.close()
        assert [got.get(k) for k in range(len(queries))] == expected
        stats = scheduler.stats()
        assert stats["batched"] and stats["max_batch"] > 1  # several requests per step
        assert stats["max_batch"] <= 3  # each loop steps at most its half of the 6


@pytest.mark.parametrize("name", ["needle3", "transformer"])
def test_two_engine_loops_at_once_keep_the_bits(name):
    """Two threads stepping disjoint halves of the requests with their own run_batch calls
    (one loop's micro-batches in the stages while the other's are too): the bits alone."""
    import threading

    path, reference, prompts, options = _cases(name)
    expected = [reference.forward(p) for p in prompts]
    with load_staged(path, [0, 2], **options) as staged:
        sessions = [staged.session(chunk=32) for _ in prompts]
        failures: list = []

        def loop(share: range) -> None:
            try:
                mine = [(sessions[i], prompts[i]) for i in share]
                staged.run_batch([(s, p[:-5], False) for s, p in mine])
                for step in range(5, 0, -1):
                    rows = staged.run_batch([(s, [p[-step]], False) for s, p in mine])
                    for i, row in zip(share, rows, strict=True):
                        assert_bits(row, expected[i][-step], f"{name} loop step {i}")
            except BaseException as error:  # noqa: BLE001 - reported below
                failures.append(error)

        threads = [threading.Thread(target=loop, args=(range(k, 8, 2),)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert failures == []


def test_bad_input_in_one_request_breaks_no_session():
    from needlepoint.errors import ModelInputError

    reference = model("tiny")
    prompts = [long_prompt("tiny", 30)[k:] for k in range(3)]
    with load_staged(fixture_path("tiny"), [0, 2], cache=False) as staged:
        sessions = [staged.session() for _ in prompts]
        bad = [(s, p, False) for s, p in zip(sessions, prompts, strict=True)]
        bad[1] = (sessions[1], [staged.config.vocab], False)
        with pytest.raises(ModelInputError):
            staged.run_batch(bad)
        assert staged.run_batch([]) == []
        got = staged.run_batch([(s, p, False) for s, p in zip(sessions, prompts, strict=True)])
        for row, p in zip(got, prompts, strict=True):
            assert_bits(row, reference.forward(p)[-1])
