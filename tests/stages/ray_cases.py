"""Stages on a real Ray cluster of two nodes (a head with custom resource `node_a`, a second
node with `node_b`), run by `test_stages_ray.py` inside a network namespace that has only
loopback (`unshare -n`), so nothing here can reach any other address. Not collected by a
plain `pytest` run (no `test_` prefix): only that test runs it.

Every expected value comes from the single-process model in this process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from conftest import REPO_ROOT, toy_model_path
from corrupt_helpers import corrupt_copy
from stages_helpers import (
    assert_bits,
    assert_non_finite_refused,
    fixture_path,
    long_prompt,
    run_through_a_kill,
    stepped,
)
from v3_helpers import model

import needlepoint
from needlepoint.errors import (
    StageLostError,
    StageNonFiniteError,
    StagePlacementError,
    StageSessionLostError,
    StageStartError,
)
from needlepoint.stages import load_staged

MB = 1 << 20
TOOLS = REPO_ROOT / "examples" / "tools.json"


@pytest.fixture(scope="session")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    node = dict(num_cpus=2, object_store_memory=96 * MB, node_ip_address="127.0.0.1")
    head = Cluster(initialize_head=True,
                   head_node_args=dict(node, resources={"node_a": 1}, include_dashboard=False))
    try:
        head.add_node(**node, resources={"node_b": 1})
        ray.init(address=head.address, log_to_driver=False)
        yield head
    finally:
        ray.shutdown()
        head.shutdown()


def _ray(path, stages, placement, **options):
    return load_staged(path, stages, transport="ray", placement=placement, cache=False,
                       **options)


def _alternate(count: int) -> list[str]:
    return ["node_a" if k % 2 == 0 else "node_b" for k in range(count)]


def _assert_staged_bits(staged, ids, expected, prefill: int, what: str) -> None:
    """`staged`'s forward of `ids`, and a session prefilled with the first `prefill` ids then
    stepped through the rest, bit-identical to one process's `expected` logits."""
    assert_bits(staged.forward(ids), expected, what)
    session = staged.session(chunk=16)
    assert_bits(session.prefill(ids[:prefill]), expected[prefill - 1], f"{what} prefill")
    assert_bits(np.stack([session.step(int(t)) for t in ids[prefill:]]), expected[prefill:],
                f"{what} steps")


def test_isolated_to_loopback(cluster):
    import ray

    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}
    assert sorted(k for n in nodes for k in n["Resources"] if k.startswith("node_")) == [
        "node_a", "node_b"]


def test_every_split_across_two_nodes(cluster):
    """tiny (4 blocks) at 1, 2, 3 and 4 stages, alternating nodes: forward, pipelined prefill
    and steps bit-identical to one process; `needlepoint.load(..., transport="ray")`."""
    reference = model("tiny")
    ids = long_prompt("tiny", 150)
    expected = reference.forward(ids)
    steps = stepped(reference.session(), ids[:60], first=50)
    for cuts in ([0], [0, 2], [0, 1, 3], [0, 1, 2, 3]):
        with _ray(fixture_path("tiny"), cuts, _alternate(len(cuts))) as staged:
            info = staged.stage_info()
            assert len({i["pid"] for i in info}) == len(cuts)
            assert_bits(staged.forward(ids), expected, f"forward {cuts}")
            assert_bits(staged.session(chunk=16).prefill(ids), expected[-1], f"prefill {cuts}")
            assert_bits(stepped(staged.session(chunk=16), ids[:60], first=50), steps)
    staged = needlepoint.load(fixture_path("tiny"), stages=2, transport="ray",
                              ray_address=cluster.address, cache=False)
    try:
        assert staged.transport.kind == "ray"
        assert_bits(staged.forward(ids), expected)
    finally:
        staged.close()


@pytest.mark.parametrize("stages", [2, 4])
def test_shipped_across_two_nodes(cluster, stages):
    reference = model("shipped")
    ids = long_prompt("shipped", 200)
    expected = reference.forward(ids)
    with _ray(fixture_path("shipped"), stages, _alternate(stages)) as staged:
        assert_bits(staged.forward(ids), expected, f"forward, {stages} stages")
        session = staged.session(chunk=48)
        assert_bits(session.prefill(ids[:190]), expected[189])
        assert_bits(np.stack([session.step(int(t)) for t in ids[190:]]), expected[190:])


def test_float_numerics_across_nodes(cluster):
    reference = model("small", numerics="float")
    ids = long_prompt("small", 160)
    with _ray(fixture_path("small"), [0, 5], ["node_b", "node_a"], numerics="float") as staged:
        assert_bits(staged.forward(ids), reference.forward(ids), "float forward")


def test_stage_rss_scales_with_its_share(cluster):
    """Each stage process reads only its blocks' records: after a forward, the archive bytes
    resident in the 15-block stage are about 3x those of the 5-block stage, and neither holds
    more than its blocks' records (plus pages shared at record boundaries)."""
    ids = long_prompt("shipped", 64)
    with _ray(fixture_path("shipped"), [0, 15], ["node_a", "node_b"]) as staged:
        staged.forward(ids)
        big, small = staged.stage_info()
        shares = [r.weight_bytes for r in staged.plan.ranges]
        for info, share in ((big, shares[0]), (small, shares[1])):
            assert 0.5 * share < info["archive_resident_bytes"] < share + 2 * MB, (info, share)
            assert info["rss_bytes"] > info["archive_resident_bytes"]
        ratio = big["archive_resident_bytes"] / small["archive_resident_bytes"]
        assert 2.0 < ratio < 4.0, ratio
        print(json.dumps({"stage_rss": [big, small]}))


def test_sessions_many_at_once_across_nodes(cluster):
    reference = model("small")
    prompts = [long_prompt("small", 60 + 30 * k)[k:] for k in range(4)]
    expected = [reference.forward(p)[-1] for p in prompts]
    results: dict[int, np.ndarray] = {}
    with _ray(fixture_path("small"), 2, ["node_a", "node_b"]) as staged:
        def run(k: int) -> None:
            results[k] = staged.session(chunk=32).prefill(prompts[k])

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for k in range(4):
            assert_bits(results[k], expected[k], f"session {k}")


def test_non_finite_refused_across_a_hop(cluster, tmp_path):
    path = corrupt_copy(tmp_path, "layer01.w1b")
    with _ray(path, [0, 2], ["node_a", "node_b"], numerics="float") as staged:
        with pytest.raises(StageNonFiniteError, match="not sent to stage 1") as caught:
            staged.forward([1, 2, 3, 4])
        assert caught.value.stage == 0
    with _ray(fixture_path("tiny"), [0, 2], ["node_a", "node_b"]) as staged:
        assert_non_finite_refused(staged, 2, (0, 0, 0), np.nan,
                                  "received non-finite activations from stage 0")


def test_killed_stage_fails_the_request_fast_and_recovers(cluster):
    reference = model("shipped")
    ids = long_prompt("shipped", 1024)
    # without replay (max_stage_recoveries=0): the failure of today; with replay on (the
    # default) the request continues: ray_recovery_cases.py
    with _ray(fixture_path("shipped"), 2, ["node_a", "node_b"],
              max_stage_recoveries=0) as staged:
        old = staged.session()
        old.prefill(ids[:20])
        victim = staged.stage_info()[1]
        outcome: dict = {}

        def long_prefill() -> None:
            try:
                staged.session(chunk=32).prefill(ids)
                outcome["finished"] = True
            except Exception as error:  # noqa: BLE001 - examined below
                outcome["error"] = error
            outcome["at"] = time.monotonic()

        worker = threading.Thread(target=long_prefill)
        worker.start()
        time.sleep(1.5)
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        worker.join(60)
        assert not worker.is_alive(), "the request hung after the stage was killed"
        assert "finished" not in outcome, "the prefill finished before the kill"
        error = outcome["error"]
        assert isinstance(error, StageLostError) and error.stage == 1, repr(error)
        assert "stage 1 (layers 10-19)" in str(error)
        assert outcome["at"] - killed < 10, outcome["at"] - killed
        with pytest.raises(StageSessionLostError, match="stage 1"):
            old.step(1)
        fresh = staged.session()  # waits for Ray's restart of the actor
        assert_bits(fresh.prefill(ids[:100]), reference.forward(ids[:100])[-1])
        again = staged.stage_info()[1]
        assert again["pid"] != victim["pid"] and again["incarnation"] != victim["incarnation"]


def test_server_stays_healthy_when_a_stage_dies(cluster):
    import openai
    from server_helpers import ServerThread, calls_of, openai_tools, user

    from needlepoint.server import create_app

    tools = json.loads(TOOLS.read_text())
    query = "wake me up at 06:45 and remind me to call the bank, then set a timer"
    single = needlepoint.Needle(tools=tools, model=model("shipped"), max_new_tokens=48)
    expected = [(c["name"], c["arguments"]) for c in single.complete(query)["function_calls"]]

    def ask(client) -> list:
        reply = client.chat.completions.create(model="shipped", messages=user(query),
                                               tools=openai_tools(tools), max_tokens=48)
        return calls_of(reply.choices[0].message)

    with _ray(fixture_path("shipped"), 2, ["node_a", "node_b"],
              max_stage_recoveries=0) as staged:  # replayed by default: ray_recovery_cases
        with ServerThread(create_app(staged, model_name="shipped")) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0,
                                   timeout=120)
            assert ask(client) == expected
            pid = staged.stage_info()[1]["pid"]
            failed: dict = {}

            def doomed() -> None:
                try:
                    failed["calls"] = ask(client)
                except openai.APIStatusError as error:
                    failed["status"], failed["text"] = error.status_code, str(error)

            # Stage 1 is stopped before the request starts; SIGKILL ends a stopped process
            # like a running one.
            run_through_a_kill(pid, doomed, 60)
            assert "calls" not in failed, "the request finished before the kill"
            assert failed["status"] >= 400 and "stage 1" in failed["text"], failed
            assert server.health()["status"] == "ok"
            deadline = time.monotonic() + 60
            while True:
                try:
                    assert ask(client) == expected
                    break
                except openai.APIStatusError:
                    assert time.monotonic() < deadline, "no success after the restart"
                    time.sleep(1)


def test_stage_that_never_starts_is_an_error_at_load(cluster, monkeypatch):
    from needlepoint.stages.ray_transport import RayTransport
    from needlepoint.stages.stage import StageSpec

    def no_actor(*args):
        raise AssertionError("an actor was started for a plan no node can place")

    # the placement is refused from the cluster's resources before any actor starts (not
    # after a stage waited out its start timeout)
    with monkeypatch.context() as patch:
        patch.setattr(RayTransport, "_start", no_actor)
        with pytest.raises(StagePlacementError, match=r"stage 1 \(layers 2-3\): no node of "
                           r"the Ray cluster offers resource nowhere") as caught:
            _ray(fixture_path("tiny"), 2, ["node_a", "nowhere"], start_timeout_s=60)
    assert caught.value.stage == 1
    # a stage whose process cannot open the archive (as on a node without the file)

    missing = StageSpec(str(toy_model_path().with_name("not-there.cact")), 0, 1, 0, 4)
    with pytest.raises(StageStartError, match=r"stage 0 \(layers 0-3\) failed to start: .*"
                       "not-there.cact") as caught:
        RayTransport([missing], None, ["node_b"], start_timeout_s=30)
    assert caught.value.stage == 0


def test_stalled_stage_times_out_naming_it(cluster):
    """A stage process that stops answering (SIGSTOP) fails the request after
    call_timeout_s with a StageLostError naming it: never a hang."""
    ids = long_prompt("tiny", 60)
    with _ray(fixture_path("tiny"), [0, 1, 3], _alternate(3), call_timeout_s=3,
              max_stage_recoveries=0) as staged:  # replayed by default: ray_recovery_cases
        session = staged.session()
        pid = staged.stage_info()[1]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StageLostError, match=r"stage 1 \(layers 1-2\) did not answer "
                               r"within 3 s") as caught:
                session.prefill(ids)
            assert caught.value.stage == 1
            assert time.monotonic() - started < 15
        finally:
            os.kill(pid, signal.SIGCONT)
        assert_bits(staged.session().prefill(ids), model("tiny").forward(ids)[-1])


def test_placement_that_cannot_fit_fails_fast_and_stage_cpus_shares(cluster):
    """Each node has 2 CPUs: 4 one-CPU stages pinned to node_a cannot fit (a typed error
    within 5 s, naming the CPUs and the fix, no actor left behind); with stage_cpus=0.5 they
    share node_a's 2 CPUs on purpose and give the single-process logits; 3 two-CPU stages
    exceed the cluster's 4 CPUs."""
    import ray

    ids = long_prompt("tiny", 40)
    total = ray.cluster_resources()["CPU"]
    deadline = time.monotonic() + 60  # actors of earlier cases give their CPUs back lazily
    while ray.available_resources().get("CPU") != total and time.monotonic() < deadline:
        time.sleep(0.5)
    for placement, options, numbers in (
            (["node_a"] * 4, {}, r"4 stages reserve 4 CPUs .* offer 127.0.0.1: 2 CPUs"),
            (None, {"stage_cpus": 2}, r"3 stages reserve 6 CPUs")):
        started = time.monotonic()
        with pytest.raises(StagePlacementError, match=numbers) as caught:
            _ray(fixture_path("tiny"), [0, 1, 2, 3][: 4 if placement else 3], placement,
                 **options)
        assert time.monotonic() - started < 5
        assert "--stage-cpus 0.5" in str(caught.value)
        assert ray.available_resources().get("CPU") == total  # no actor reserved any
    with _ray(fixture_path("tiny"), 4, ["node_a"] * 4, stage_cpus=0.5) as staged:
        assert {i["host"] for i in staged.stage_info()} == {socket.gethostname()}
        assert_bits(staged.forward(ids), model("tiny").forward(ids), "stage_cpus=0.5")


def test_transformers_across_two_nodes(cluster):
    """tiny Llama and tiny GPT-2 (int8) at every split, alternating nodes, and SmolLM2 in 2
    stages: forward and steps bit-identical to one process; a rewind reaches every node."""
    from hf_helpers import SmolLM2Reference, hf_fixture_dir
    from stages_helpers import all_cut_sets

    for name in ("llama-tiny", "gpt2-tiny"):
        path = hf_fixture_dir(name)
        reference = needlepoint.load(path, numerics="int8")
        ids = np.random.default_rng(1).integers(3, reference.config.vocab, 50)
        expected = reference.forward(ids)
        for cuts in all_cut_sets(4):
            with _ray(path, cuts, _alternate(len(cuts)), numerics="int8") as staged:
                assert_bits(staged.forward(ids), expected, f"{name} {cuts}")
    path = SmolLM2Reference().path
    reference = needlepoint.load(path, numerics="int8")
    ids = np.random.default_rng(2).integers(3, reference.config.vocab, 40)
    expected = reference.forward(ids)
    with _ray(path, 2, ["node_a", "node_b"], numerics="int8") as staged:
        assert {i["host"] for i in staged.stage_info()} == {socket.gethostname()}
        session = staged.session(chunk=16)
        assert_bits(session.prefill(ids[:36]), expected[35], "smollm2 prefill")
        session.extend(np.full(5, 77))
        session.rewind(5)
        assert_bits(np.stack([session.step(int(t)) for t in ids[36:]]), expected[36:])


def test_qwen_and_gemma_across_two_nodes(cluster):
    """Issue 28 item 3: Qwen2, Qwen3 (every split) and Gemma 3 (cuts on both sides of its
    full-attention layer) in int8 on two nodes: forward, and a session prefilled past Gemma's
    48-position sliding window then stepped, bit-identical to one process."""
    from hf_helpers import hf_fixture_dir
    from stages_helpers import all_cut_sets

    splits = {"qwen2-tiny": all_cut_sets(4), "qwen3-tiny": all_cut_sets(4),
              "gemma3-tiny": [[0, 3], [0, 5], [0, 2, 4]]}
    for name, cut_sets in splits.items():
        path = hf_fixture_dir(name)
        reference = needlepoint.load(path, numerics="int8")
        ids = np.random.default_rng(3).integers(3, reference.config.vocab, 70)
        expected = reference.forward(ids)
        for cuts in cut_sets:
            with _ray(path, cuts, _alternate(len(cuts)), numerics="int8") as staged:
                _assert_staged_bits(staged, ids, expected, 60, f"{name} {cuts}")


def test_gguf_weights_in_place_across_two_nodes(cluster, tmp_path):
    """Q4_K_M-style GGUF copies of the Qwen2 and Gemma 3 fixtures (Q4_K / Q6_K / Q8_0 blocks
    multiplied where they lie in each stage's own mapping of the file) in int8 on two nodes:
    forward and a prefilled then stepped session bit-identical to one process."""
    from gguf_family_helpers import write_family_gguf

    for name, cuts in (("qwen2-tiny", [0, 2]), ("gemma3-tiny", [0, 3])):
        path = write_family_gguf(name, tmp_path / f"{name}.gguf", "Q4_K_M")
        reference = needlepoint.load(path, numerics="int8")
        ids = np.random.default_rng(4).integers(3, reference.config.vocab, 64)
        expected = reference.forward(ids)
        with _ray(path, cuts, _alternate(len(cuts)), numerics="int8") as staged:
            _assert_staged_bits(staged, ids, expected, 56, f"{name} gguf")


def test_rewind_across_nodes(cluster):
    reference = model("tiny")
    ids = long_prompt("tiny", 120)
    expected = reference.forward(ids)
    with _ray(fixture_path("tiny"), [0, 2], ["node_a", "node_b"]) as staged:
        session = staged.session(chunk=32)
        session.prefill(ids[:100])
        session.extend(np.full(30, 40))
        session.rewind(30)
        assert_bits(session.extend(ids[100:]), expected[100:], "after a rewind")
