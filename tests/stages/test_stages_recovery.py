"""Replay on a lost stage (issue 30 item 1), in-process transport: a stage is "lost" in the
middle of a call (the test double below raises `StageLostError` as the Ray transport does
and puts a fresh stage in its place, whose sessions are gone, as Ray's restart of an actor
does); the head rebuilds every session on it from their tokens and re-issues the call. Every
expected value comes from the single-process model; the Ray version (a real kill -9) is in
ray_recovery_cases.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from hf_helpers import hf_fixture_dir
from stages_helpers import assert_bits, fixture_path, long_prompt
from v3_helpers import model

import needlepoint
from needlepoint.errors import StageLostError, StageSessionLostError
from needlepoint.stages import load_staged


class Dying:
    """Stage `k` of a local transport that is lost at its `after`-th chunk call: the call
    raises `StageLostError` and a fresh stage replaces it (no sessions)."""

    def __init__(self, transport, k: int, after: int) -> None:
        self.transport, self.k, self.left = transport, k, after
        self.real = transport.stages[k]

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def _tick(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.transport.restart(self.k)
            raise StageLostError(f"stage {self.k} was lost (test double)", self.k)

    def run(self, *args):
        self._tick()
        return self.real.run(*args)

    def run_many(self, *args):
        self._tick()
        return self.real.run_many(*args)


class LostOn(Dying):
    """Stage `k`, lost at its first call of `method` (a rewind, an open); every other call
    goes to the real stage."""

    method = ""

    def __init__(self, transport, k: int, method: str) -> None:
        super().__init__(transport, k, 1)
        self.method = method

    def __getattr__(self, name: str):
        real = getattr(self.real, name)
        if name != self.method:
            return real

        def lost(*args):
            self._tick()
            return real(*args)

        return lost


def lose(staged, k: int, after: int = 1) -> None:
    staged.transport.stages[k] = Dying(staged.transport, k, after)


def live_counts(staged) -> list[int]:
    return [info["sessions"] for info in staged.stage_info()]


def test_sessions_survive_a_lost_stage_with_the_same_bits():
    """An idle session, one mid-decode and a kv-window ring: the stage is lost during a
    step; every session continues with the single-process logits, nothing is left over."""
    reference = model("tiny")
    ids = long_prompt("tiny", 120)
    expected = reference.forward(ids)
    with load_staged(fixture_path("tiny"), [0, 2]) as staged:
        idle = staged.session(chunk=16)
        assert_bits(idle.prefill(ids[:70]), expected[69])
        busy = staged.session(chunk=16)
        busy.prefill(ids[:90])
        ring = staged.session(kv_window=32, chunk=16)
        ring_expected = model("tiny").session(kv_window=32).prefill(ids[:100])
        ring.prefill(ids[:60])
        lose(staged, 1)
        assert_bits(np.stack([busy.step(int(t)) for t in ids[90:100]]), expected[90:100])
        assert_bits(idle.extend(ids[70:80]), expected[70:80], "the idle session")
        assert_bits(ring.extend(ids[60:100])[-1], ring_expected, "the ring")
        health = staged.stage_health()
        assert health["losses"] == 1 and health["recoveries"] == 1, health
        assert health["replays"] == 3 and health["status"] == "ok", health
        assert live_counts(staged) == [3, 3]  # no replay session left behind
        ring.close()
        assert live_counts(staged) == [2, 2]


def test_lost_in_the_middle_of_a_long_prefill():
    """The first stage lost at the 3rd of 8 chunks: the call is re-issued whole."""
    reference = model("tiny")
    ids = long_prompt("tiny", 128)
    with load_staged(fixture_path("tiny"), [0, 1, 3]) as staged:
        session = staged.session(chunk=16)
        session.prefill(ids[:8])
        lose(staged, 0, after=3)
        assert_bits(session.extend(ids[8:]), reference.forward(ids)[8:])
        assert staged.stage_health()["losses"] == 1


def test_run_batch_survives_a_lost_stage():
    """The server's engine step (`run_batch`): a stage lost mid-batch, every request's
    logits as alone, and the same next steps after."""
    reference = model("small")
    prompts = [long_prompt("small", 40 + 13 * k)[k:] for k in range(4)]
    with load_staged(fixture_path("small"), 2) as staged:
        sessions = [staged.session(chunk=16) for _ in prompts]
        lose(staged, 1, after=2)
        got = staged.run_batch([(s, p, False) for s, p in zip(sessions, prompts, strict=True)])
        for k, prompt in enumerate(prompts):
            assert_bits(got[k], reference.forward(prompt)[-1], f"request {k}")
            extended = np.concatenate([prompt, [5]])
            assert_bits(sessions[k].step(5), reference.forward(extended)[-1])
        assert live_counts(staged) == [4, 4]


def test_extend_and_rewind_survive_a_loss_transformer():
    """llama-tiny int8 (the speculative loop's calls: extend a draft, rewind the rejected):
    a loss in the extend and one in the rewind."""
    path = hf_fixture_dir("llama-tiny")
    reference = needlepoint.load(path, numerics="int8")
    ids = np.random.default_rng(4).integers(3, reference.config.vocab, 60).astype(np.int64)
    expected = reference.forward(ids)
    with load_staged(path, [0, 2], numerics="int8") as staged:
        session = staged.session(chunk=8)
        session.prefill(ids[:40])
        lose(staged, 1)
        session.extend(np.full(6, 9))
        staged.transport.stages[0] = LostOn(staged.transport, 0, "rewind")
        session.rewind(6)
        assert_bits(session.extend(ids[40:]), expected[40:], "after the losses")
        assert staged.stage_health()["losses"] == 2


@contextlib.contextmanager
def _losing_stage_1(max_stage_recoveries: int) -> Iterator[tuple]:
    """The tiny model in two local stages, a session that has prefilled 20 prompt ids, and
    stage 1 set to be lost at its next call: (staged, session)."""
    ids = long_prompt("tiny", 40)
    with load_staged(fixture_path("tiny"), [0, 2],
                     max_stage_recoveries=max_stage_recoveries) as staged:
        session = staged.session()
        session.prefill(ids[:20])
        lose(staged, 1)
        yield staged, session


def test_without_recoveries_the_call_fails_as_before():
    with _losing_stage_1(max_stage_recoveries=0) as (staged, session):
        with pytest.raises(StageLostError, match="stage 1") as caught:
            session.step(3)
        assert caught.value.stage == 1
        with pytest.raises(StageSessionLostError):
            session.step(3)
        assert staged.stage_health()["replays"] == 0


def test_losses_past_the_bound_fail_naming_the_stage():
    """max_stage_recoveries=1 within the window: the second loss fails the call."""
    with _losing_stage_1(max_stage_recoveries=1) as (staged, session):
        session.step(3)
        lose(staged, 1)
        with pytest.raises(StageLostError, match=r"stage 1 .*max_stage_recoveries=1") as caught:
            session.step(4)
        assert caught.value.stage == 1
        health = staged.stage_health()
        assert health["losses"] == 2 and health["failures"] == 1, health


def test_recovery_options_are_checked():
    with pytest.raises(ValueError, match="max_stage_recoveries"):
        load_staged(fixture_path("tiny"), 2, max_stage_recoveries=-1)


def test_a_session_opened_while_a_stage_is_lost_opens_once_it_is_back():
    """The server opens a request's session when it arrives: a stage lost then is waited
    for, as in a call."""
    ids = long_prompt("tiny", 30)
    with load_staged(fixture_path("tiny"), [0, 2]) as staged:
        staged.transport.stages[1] = LostOn(staged.transport, 1, "open")
        session = staged.session()
        assert_bits(session.prefill(ids), model("tiny").forward(ids)[-1])
        assert staged.stage_health()["losses"] == 1
        assert live_counts(staged) == [1, 1]


def test_server_streams_through_a_lost_stage_and_health_says_degraded_meanwhile():
    """The server on a staged toy model: a stage lost during a streamed answer; while the
    head waits for it (held here) /health says "degraded" and /metrics has the stage
    recovering; released, the answer completes with the single process's calls and the
    loss and replay are counted."""
    import json
    import threading
    import urllib.request

    import openai
    from conftest import REPO_ROOT, toy_model_path
    from server_helpers import ServerThread, collect_stream, openai_tools, user

    from needlepoint.server import create_app

    tools = openai_tools(json.loads((REPO_ROOT / "examples" / "tools.json").read_text()))
    with load_staged(toy_model_path(), 2, cache=False) as staged:
        transport, held, release = staged.transport, threading.Event(), threading.Event()
        back = transport.wait_back

        def wait_back(stage: int, timeout: float) -> str:
            held.set()
            assert release.wait(60)
            return back(stage, timeout)

        transport.wait_back = wait_back
        with ServerThread(create_app(staged, model_name="toy")) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
            answer: dict = {}

            def stream() -> None:
                answer.update(collect_stream(client.chat.completions.create(
                    model="toy", messages=user("wake me up at 06:45"), tools=tools,
                    stream=True)))

            lose(staged, 1, after=2)
            worker = threading.Thread(target=stream)
            worker.start()
            assert held.wait(60), "the stage was not lost"
            health = server.health()
            assert health["status"] == "degraded" and health["stages"]["recovering"] == [1]
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
                assert "needlepoint_stages_recovering 1.0" in reply.read().decode()
            release.set()
            worker.join(60)
            assert answer["calls"] == [("set_alarm", {"time": "06:45"})]
            health = server.health()
            assert health["status"] == "ok" and health["stages"]["losses"] == 1
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
                metrics = reply.read().decode()
            assert "needlepoint_stage_losses_total 1.0" in metrics
            assert "needlepoint_stage_replays_total 1.0" in metrics
            assert "needlepoint_stages_recovering 0.0" in metrics


def test_replicas_spread_sessions_and_a_lost_replicas_sessions_move():
    """replicas=2 (local): sessions alternate between the replicas; replica 0's stage 1 is
    lost during an engine step: its sessions go on in replica 1 (replayed there, without
    waiting for the restart) with the single process's logits; nothing is left on replica
    0; the restarted replica takes new sessions again."""
    from needlepoint.stages.replicas import ReplicatedModel

    reference = model("small")
    prompts = [long_prompt("small", 30 + 9 * k)[k:] for k in range(4)]
    with load_staged(fixture_path("small"), 2, replicas=2) as staged:
        assert isinstance(staged, ReplicatedModel) and staged.pipeline_depth == 4
        sessions = [staged.session(chunk=16) for _ in prompts]
        first, second = staged.replicas
        assert [s.model for s in sessions] == [first, second, first, second]
        for session, prompt in zip(sessions, prompts, strict=True):
            session.prefill(prompt[:-1], logits=False)
        waits, back = [], first.transport.wait_back
        first.transport.wait_back = lambda k, timeout: waits.append(timeout) or back(k, timeout)
        lose(first, 1)
        got = staged.run_batch([(s, p[-1:], False) for s, p in zip(sessions, prompts,
                                                                    strict=True)])
        for k, prompt in enumerate(prompts):
            assert_bits(got[k], reference.forward(prompt)[-1], f"request {k}")
        assert all(s.model is second for s in sessions)
        assert max(waits, default=0) <= 0.05  # only probes: the move did not wait
        assert live_counts(first) == [0, 0] and live_counts(second) == [4, 4]
        health = staged.stage_health()
        assert health["losses"] == 1 and health["replays"] == 2, health
        assert_bits(sessions[0].step(7), reference.forward(np.append(prompts[0], 7))[-1])
        assert staged.session().model is first  # back (restarted), fewest sessions
        info = staged.stage_info()
        assert [i["replica"] for i in info] == [0, 0, 1, 1]


def test_needlepoint_load_places_replicas():
    """`needlepoint.load(..., stages=2, replicas=2)` is the replicated model of `load_staged`,
    with the single process's logits."""
    import needlepoint
    from needlepoint.stages.replicas import ReplicatedModel

    ids = long_prompt("tiny", 20)
    with needlepoint.load(fixture_path("tiny"), stages=2, replicas=2) as staged:
        assert isinstance(staged, ReplicatedModel) and len(staged.replicas) == 2
        assert_bits(staged.forward(ids), model("tiny").forward(ids), "replicated forward")


def test_replica_placement_is_checked():
    from needlepoint.errors import StagePlanError

    with pytest.raises(StagePlanError, match="replicas must be a positive int"):
        load_staged(fixture_path("tiny"), 2, replicas=0)
    with pytest.raises(StagePlanError, match="3 entries for 2 stages x 2 replicas"):
        load_staged(fixture_path("tiny"), 2, replicas=2, transport="ray",
                    placement=["a", "b", "c"])


def test_replicas_on_the_command_line():
    import argparse

    from needlepoint.errors import StagePlanError
    from needlepoint.stages.options import add_stage_arguments, staged_from_args
    from needlepoint.stages.replicas import ReplicatedModel

    parser = argparse.ArgumentParser()
    add_stage_arguments(parser)
    staged = staged_from_args(fixture_path("tiny"), parser.parse_args(["--stages", "2",
                                                                        "--replicas", "2"]))
    try:
        assert isinstance(staged, ReplicatedModel) and len(staged.replicas) == 2
        ids = long_prompt("tiny", 20)
        assert_bits(staged.forward(ids), model("tiny").forward(ids))
    finally:
        staged.close()
    with pytest.raises(StagePlanError, match="--replicas needs --stages"):
        staged_from_args(fixture_path("tiny"), parser.parse_args(["--replicas", "2"]))
