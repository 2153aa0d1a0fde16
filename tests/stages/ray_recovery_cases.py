"""A stage process killed (`kill -9`) in the middle of requests on a real two-node Ray
cluster (issue 30 items 1, 2, 5): the head replays the sessions into Ray's restart of the
stage and every request finishes with the tokens of an undisturbed run. Run by
`test_stages_ray_recovery.py` inside a loopback-only namespace, as `ray_cases.py` is (not
collected by a plain pytest run). Expected values come from the single-process model.

The stage is stopped (SIGSTOP) before it is killed, so the kill lands while requests are in
flight on it (a fast machine could finish them within any fixed sleep).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
import urllib.request
from typing import Any

import numpy as np
from conftest import REPO_ROOT
from mcp_helpers import free_port, stop_process
from ray_cases import cluster  # noqa: F401 - the two-node cluster fixture
from stages_helpers import assert_bits, fixture_path, long_prompt, run_through_a_kill
from v3_helpers import model

import needlepoint
from needlepoint.stages import load_staged

TOOLS = REPO_ROOT / "examples" / "tools.json"
DECODE = 20  # greedy tokens per request


def greedy(session, prompt: np.ndarray, count: int, progress=None) -> list[int]:
    logits, out = session.prefill(prompt), []
    for _ in range(count):
        out.append(int(np.argmax(logits)))
        if progress is not None:
            progress()
        logits = session.step(out[-1])
    return out


def _kill_mid_decode(staged, stage: int, prompts, started: threading.Semaphore) -> dict:
    """Each prompt greedily decoded in its own thread; once every thread has decoded 3
    tokens the stage is stopped, then killed. Each thread's tokens (or its error)."""
    out: dict[int, object] = {}
    pid = staged.stage_info()[stage]["pid"]

    def run(k: int) -> None:
        seen = [0]

        def progress() -> None:
            seen[0] += 1
            if seen[0] == 3:
                started.release()

        try:
            out[k] = greedy(staged.session(chunk=32), prompts[k], DECODE, progress)
        except Exception as error:  # noqa: BLE001 - examined by the test
            out[k] = error

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(prompts))]
    for thread in threads:
        thread.start()
    for _ in prompts:
        assert started.acquire(timeout=120), "the requests did not start decoding"
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    out["killed_at"] = time.monotonic()
    for thread in threads:
        thread.join(180)
        assert not thread.is_alive(), "a request hung after the stage was killed"
    out["pid"] = pid
    return out


def _check_survived(staged, stage: int, got: dict, expected: list, sessions: int) -> None:
    for k, tokens in enumerate(expected):
        assert got[k] == tokens, f"request {k}: {got[k]!r} != {tokens}"
    gc.collect()  # the requests' sessions are closed when collected
    info = staged.stage_info()
    assert info[stage]["pid"] != got["pid"], "the stage was not restarted"
    assert [i["sessions"] for i in info] == [sessions] * len(info), info  # no leftovers
    health = staged.stage_health()
    assert health["losses"] == 1 and health["recoveries"] >= 1 and health["failures"] == 0
    assert health["replays"] >= 4 and health["status"] == "ok", health
    print(json.dumps({"recovery": health}))


def test_needle3_requests_survive_a_killed_stage(cluster):  # noqa: F811
    """Shipped geometry in 2 stages: 4 concurrent greedy decodes and an idle chat session
    (its next answer after the loss is the single process's); kill -9 of stage 1."""
    reference = model("shipped")
    prompts = [long_prompt("shipped", 40 + 25 * k)[k:] for k in range(4)]
    expected = [greedy(reference.session(), p, DECODE) for p in prompts]
    chat = long_prompt("shipped", 120)
    chat_expected = greedy(reference.session(), chat, 8)
    with load_staged(fixture_path("shipped"), 2, transport="ray",
                     placement=["node_a", "node_b"], cache=False) as staged:
        idle = staged.session(chunk=32)
        idle.prefill(chat[:100], logits=False)  # a conversation waiting for its next turn
        got = _kill_mid_decode(staged, 1, prompts, threading.Semaphore(0))
        assert greedy_continue(idle, chat[100:], 8) == chat_expected
        _check_survived(staged, 1, got, expected, 1)


def greedy_continue(session, more: np.ndarray, count: int) -> list[int]:
    """The rest of a prompt fed to a live session, then `count` greedy tokens."""
    logits, out = session.extend(more)[-1], []
    for _ in range(count):
        out.append(int(np.argmax(logits)))
        logits = session.step(out[-1])
    return out


def test_smollm2_requests_survive_a_killed_stage(cluster):  # noqa: F811
    """SmolLM2 (int8) in 2 stages: 4 concurrent greedy decodes, kill -9 of stage 0."""
    from hf_helpers import SmolLM2Reference

    path = SmolLM2Reference().path
    reference = needlepoint.load(path, numerics="int8")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, reference.config.vocab, 30 + 20 * k) for k in range(4)]
    expected = [greedy(reference.session(), p, DECODE) for p in prompts]
    with load_staged(path, 2, transport="ray", placement=["node_a", "node_b"],
                     numerics="int8", cache=False) as staged:
        got = _kill_mid_decode(staged, 0, prompts, threading.Semaphore(0))
        _check_survived(staged, 0, got, expected, 0)


def test_streaming_server_answer_survives_a_killed_stage(cluster):  # noqa: F811
    """The server (the app `needlepoint serve` runs) on the shipped geometry in 2 stages:
    a streamed tool-call answer (speculative decoding on: the server's default) with stage
    1 killed while it is in flight gives the same calls as one process; /metrics counts
    the loss and the replays, /health is ok after (its "degraded" while a stage recovers:
    test_stages_recovery.py holds a recovery open to see it)."""
    import openai
    from server_helpers import ServerThread

    from needlepoint.server import create_app

    tools = json.loads(TOOLS.read_text())
    expected = _single_process_calls(tools)

    with load_staged(fixture_path("shipped"), 2, transport="ray",
                     placement=["node_a", "node_b"], cache=False) as staged:
        with ServerThread(create_app(staged, model_name="shipped")) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0,
                                   timeout=180)
            pid = staged.stage_info()[1]["pid"]
            assert _stream_through_a_kill(client, tools, pid)["calls"] == expected
            health = server.health()
            assert health["status"] == "ok" and health["stages"]["losses"] == 1, health
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
                metrics = reply.read().decode()
            assert "needlepoint_stage_losses_total 1.0" in metrics, metrics[-2000:]
            assert "needlepoint_stage_replays_total" in metrics
            assert staged.stage_info()[1]["pid"] != pid


QUERY = "wake me up at 06:45 and remind me to call the bank, then set a timer"


def _single_process_calls(tools: list) -> list:
    """The shipped model's calls for QUERY in this process, unstaged (what a replay gives)."""
    single = needlepoint.Needle(tools=tools, model=model("shipped"), max_new_tokens=48)
    return [(c["name"], c["arguments"]) for c in single.complete(QUERY)["function_calls"]]


def _stream_through_a_kill(client: Any, tools: list, pid: int) -> dict:
    """QUERY streamed through the openai `client` while stage process `pid` is stopped, then
    killed: the collected answer (the stream must end, without an error)."""
    from server_helpers import collect_stream, openai_tools, user

    answer: dict = {}

    def stream() -> None:
        try:
            answer.update(collect_stream(client.chat.completions.create(
                model="shipped", messages=user(QUERY), tools=openai_tools(tools),
                max_tokens=48, stream=True)))
        except Exception as error:  # noqa: BLE001 - examined below
            answer["error"] = error

    worker = run_through_a_kill(pid, stream, 180)
    assert not worker.is_alive(), "the streamed answer hung after the kill"
    assert "error" not in answer, answer
    return answer


def _stage_processes() -> set[int]:
    """Process ids of the Ray stage actors alive now (Ray titles them ray::StageActor)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    line = handle.read()
            except OSError:
                continue
            if line.startswith(b"ray::StageActor"):
                found.add(int(entry))
    return found


def test_needlepoint_serve_streams_through_a_killed_stage(cluster, tmp_path):  # noqa: F811
    """`needlepoint serve --stages 2 --ray ADDRESS` in its own process, the openai client
    streaming a tool-call answer while one of its stage processes is stopped, then killed:
    the answer has the single process's calls, /health counts the loss."""
    import subprocess
    import sys

    import openai

    _cpus_free()
    tools = json.loads(TOOLS.read_text())
    expected = _single_process_calls(tools)
    port = free_port()
    before = _stage_processes()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "needlepoint", "serve", "--model",
         str(fixture_path("shipped")), "--stages", "2", "--ray", cluster.address,
         "--placement", "node_a,node_b", "--port", str(port), "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                    if json.loads(reply.read())["status"] == "ok":
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "needlepoint serve did not come up"
            time.sleep(0.5)
        stages = sorted(_stage_processes() - before)
        assert len(stages) == 2, stages
        victim = stages[-1]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=180)
        assert _stream_through_a_kill(client, tools, victim)["calls"] == expected
        with urllib.request.urlopen(f"{url}/health", timeout=30) as reply:
            health = json.loads(reply.read())
        assert health["status"] == "ok" and health["stages"]["losses"] == 1, health
    finally:
        stop_process(server, 60, 30)
        log.close()


def _cpus_free() -> None:
    """Wait for the CPUs of earlier cases' actors (given back lazily)."""
    import ray

    total = ray.cluster_resources()["CPU"]
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU") != total and time.monotonic() < deadline:
        time.sleep(0.5)


def test_silent_stage_is_restarted_and_replayed(cluster):  # noqa: F811
    """A stage that stops answering (SIGSTOP) past call_timeout_s is killed so that Ray
    restarts it, and the session is replayed: the same logits as one process."""
    reference = model("tiny")
    ids = long_prompt("tiny", 60)
    placement = ["node_a", "node_b", "node_a"]
    with load_staged(fixture_path("tiny"), [0, 1, 3], transport="ray", placement=placement,
                     call_timeout_s=3, cache=False) as staged:
        session = staged.session(chunk=16)
        session.prefill(ids[:40], logits=False)
        pid = staged.stage_info()[1]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            assert_bits(session.extend(ids[40:]), reference.forward(ids)[40:])
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert staged.stage_info()[1]["pid"] != pid
        health = staged.stage_health()
        assert health["losses"] == 1 and health["failures"] == 0, health


def test_replicas_across_two_nodes_move_a_lost_replicas_sessions(cluster):  # noqa: F811
    """2 stages x 2 replicas over the two nodes (replica 0: node_a, node_b; replica 1:
    node_b, node_a): 4 concurrent greedy decodes spread over the replicas, replica 0's
    stage 1 killed mid-decode: its sessions move to replica 1 and every request's tokens
    are the single process's; replica 0 holds no session after."""
    _cpus_free()
    reference = model("small")
    prompts = [long_prompt("small", 40 + 15 * k)[k:] for k in range(4)]
    expected = [greedy(reference.session(), p, DECODE) for p in prompts]
    with load_staged(fixture_path("small"), 2, transport="ray", replicas=2, cache=False,
                     placement=["node_a", "node_b", "node_b", "node_a"]) as staged:
        first, second = staged.replicas
        got = _kill_mid_decode(staged, 1, prompts, threading.Semaphore(0))
        for k, tokens in enumerate(expected):
            assert got[k] == tokens, f"request {k}: {got[k]!r} != {tokens}"
        gc.collect()
        deadline = time.monotonic() + 60  # replica 0's stage restarts meanwhile
        while first.recovery.down and time.monotonic() < deadline:
            first.recovery.refresh()
            time.sleep(0.2)
        assert not first.recovery.down, "replica 0's stage did not come back"
        assert [i["sessions"] for i in first.stage_info()] == [0, 0]
        assert [i["sessions"] for i in second.stage_info()] == [0, 0]  # all closed
        health = staged.stage_health()
        assert health["losses"] == 1 and health["failures"] == 0, health
        assert health["replays"] == 2, health  # replica 0's two sessions, moved once each
        print(json.dumps({"replicas": health}))


def test_no_stage_actor_is_left_after_recovery(cluster):  # noqa: F811
    """After the cases above (every model closed): each CPU a stage reserved is free again,
    so no restarted or replacement actor outlives its model (the runner checks /dev/shm and
    the processes once the namespace is gone)."""
    import ray

    total = ray.cluster_resources()["CPU"]
    deadline = time.monotonic() + 60  # actors give their CPUs back lazily
    while ray.available_resources().get("CPU") != total and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU") == total, ray.available_resources()
