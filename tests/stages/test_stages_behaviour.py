"""The staged model's plan, its refusals and its failures (in-process transport), and the
front ends on top of it: `needlepoint.load(stages=...)`, `Needle`, `needlepoint run
--stages`, the HTTP server. Expected answers come from the single-process model."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from conftest import REPO_ROOT, get_fixture, toy_model_path
from corrupt_helpers import corrupt_copy
from stages_helpers import assert_bits, assert_non_finite_refused, fixture_path, long_prompt
from v3_helpers import model

import needlepoint
from needlepoint.cli.main import main
from needlepoint.errors import (
    NonFiniteActivationError,
    StageNonFiniteError,
    StagePlanError,
    StageSessionLostError,
)
from needlepoint.models.needle3.parts import layer_bytes
from needlepoint.stages import StagedModel, load_staged, plan_stages
from needlepoint.stages.plan import balanced_cuts

TOOLS = REPO_ROOT / "examples" / "tools.json"


# -- the plan --------------------------------------------------------------------------------
def _largest(weights, starts) -> int:
    ends = list(starts[1:]) + [len(weights)]
    return max(sum(weights[a:b]) for a, b in zip(starts, ends, strict=True))


def test_balanced_cuts_minimise_the_largest_stage():
    rng = np.random.default_rng(7)
    for _ in range(40):
        weights = [int(w) for w in rng.integers(1, 100, size=int(rng.integers(1, 9)))]
        for count in range(1, len(weights) + 1):
            cuts = balanced_cuts(weights, count)
            assert cuts[0] == 0 and len(cuts) == count and cuts == sorted(set(cuts))
            best = min(_largest(weights, (0, *c)) for c in
                       itertools.combinations(range(1, len(weights)), count - 1))
            assert _largest(weights, cuts) == best


def test_plan_by_weight_bytes_of_the_shipped_geometry():
    archive = needlepoint.open_archive(fixture_path("shipped"))
    kept = tuple(range(archive.config.num_layers))
    sizes = layer_bytes(archive, kept)
    assert all(s > 0 for s in sizes)
    plan = plan_stages(sizes, 4)
    assert [r.first for r in plan.ranges] == balanced_cuts(sizes, 4)
    assert sum(r.weight_bytes for r in plan.ranges) == sum(sizes)
    assert plan.ranges[-1].end == 20 and plan.ranges[1].describe().startswith("stage 1 (layers")
    explicit = plan_stages(sizes, [0, 7, 14])
    assert [(r.first, r.end) for r in explicit.ranges] == [(0, 7), (7, 14), (14, 20)]


@pytest.mark.parametrize("stages, words", [
    (0, "1 to 4 stages"), (5, "1 to 4 stages"), (True, "count"), ([1, 2], "start at layer 0"),
    ([0, 2, 2], "strictly increasing"), ([0, 4], "past the last layer"), ("ab", "cut points"),
    ([], "cut points"),
])
def test_bad_stage_options_are_refused_by_name(stages, words):
    with pytest.raises(StagePlanError, match=words):
        load_staged(fixture_path("tiny"), stages)


def test_bad_transport_and_models_that_cannot_be_cut():
    tiny = fixture_path("tiny")
    with pytest.raises(StagePlanError, match="transport must be one of"):
        needlepoint.load(tiny, stages=2, transport="tcp")
    with pytest.raises(StagePlanError, match="stages= is needed"):
        needlepoint.load(tiny, transport="ray")
    with pytest.raises(StagePlanError, match="need transport='ray'"):
        load_staged(tiny, 2, ray_address="127.0.0.1:1")
    with pytest.raises(StagePlanError, match="Needle 2"):
        needlepoint.load(get_fixture("needle2", "small").cact, stages=2)
    assert issubclass(StagePlanError, ValueError)  # bad options, as ValueError elsewhere


def test_load_with_stages_is_the_staged_model():
    staged = needlepoint.load(fixture_path("tiny"), stages=[0, 2], cache=False)
    try:
        assert isinstance(staged, StagedModel) and staged.plan.cuts == (0, 2)
        ids = long_prompt("tiny", 50)
        assert_bits(staged.forward(ids), model("tiny").forward(ids))
        assert staged.tokenizer.vocab_size == model("tiny").tokenizer.vocab_size
        assert staged.config == model("tiny").config
        with pytest.raises(needlepoint.ModelInputError, match="out of range"):
            staged.session().prefill([staged.config.vocab])
        with pytest.raises(StagePlanError, match="trace"):
            staged.session(trace=lambda *a: None)
        info = staged.stage_info()
        assert [(i["first"], i["end"]) for i in info] == [(0, 2), (2, 4)]
        assert all(i["weight_bytes"] > 0 and i["rss_bytes"] > 0 for i in info)
    finally:
        staged.close()


# -- non-finite activations --------------------------------------------------------------------
@pytest.mark.parametrize("numerics", ["deploy", "float"])
def test_non_finite_activations_are_refused_at_the_sending_end(tmp_path, numerics):
    """NaN weights in block 1: the stage holding it (stage 0 of [0, 2]) refuses to send its
    lanes; the error names it and is a NonFiniteActivationError as in one process."""
    path = corrupt_copy(tmp_path, "layer01.w1b")
    ids = [1, 2, 3, 4, 5]
    with pytest.raises(NonFiniteActivationError):
        needlepoint.load(path, numerics="deploy", cache=False).forward(ids)
    with load_staged(path, [0, 2], numerics=numerics, cache=False) as staged:
        session = staged.session()
        with pytest.raises(StageNonFiniteError, match=r"stage 0 \(layers 0-1\)") as caught:
            session.prefill(ids)
        assert caught.value.stage == 0
        assert "not sent to stage 1" in str(caught.value)
        with pytest.raises(StageSessionLostError, match="cannot continue"):
            session.step(1)


def test_non_finite_inside_a_stage_names_the_stage_and_layer(tmp_path):
    path = corrupt_copy(tmp_path, "layer01.w1b")
    with load_staged(path, [0, 1], cache=False) as staged:
        with pytest.raises(StageNonFiniteError, match=r"stage 1 \(layers 1-3\): layer 2"):
            staged.forward([1, 2, 3])


def test_non_finite_activations_are_refused_at_the_receiving_end():
    with load_staged(fixture_path("tiny"), [0, 2], cache=False) as staged:
        assert_non_finite_refused(staged, 3, (1, 2, 5), np.inf,
                                  "stage 1 .* received non-finite activations from stage 0")
        fresh = staged.session()  # other sessions are unaffected
        ids = long_prompt("tiny", 20)
        assert_bits(fresh.prefill(ids), model("tiny").session().prefill(ids))


def test_non_finite_embeddings_are_refused_by_the_head(tmp_path):
    path = corrupt_copy(tmp_path, "embedding", values=4096)
    with load_staged(path, 2, cache=False) as staged:
        with pytest.raises(StageNonFiniteError, match="the head computed non-finite"):
            staged.forward(list(range(40)))


# -- the front ends --------------------------------------------------------------------------
def test_needle_on_a_staged_model_answers_as_on_one_process():
    tools = json.loads(TOOLS.read_text())
    single = needlepoint.Needle(tools=tools, model=needlepoint.load(toy_model_path()))
    with load_staged(toy_model_path(), [0, 1, 3], cache=False) as staged:
        needle = needlepoint.Needle(tools=tools, model=staged)
        for query in ("wake me up at 06:45", "start a 10 minute timer"):
            want, got = single.complete(query), needle.complete(query)
            for key in ("type", "function_calls", "text", "reasoning"):
                assert got[key] == want[key], key
            single.reset()
            needle.reset()


def test_cli_run_with_stages(capsys):
    args = ["run", "wake me up at 06:45", "--tools", str(TOOLS), "--json", "--seed", "1",
            "--model", str(toy_model_path())]
    assert main(args) == 0
    want = json.loads(capsys.readouterr().out)
    assert main(args + ["--stages", "0,2"]) == 0
    got = json.loads(capsys.readouterr().out)
    for key in ("type", "function_calls", "text", "reasoning", "seed"):
        assert got[key] == want[key], key
    assert main(args + ["--ray", "127.0.0.1:1"]) == 2
    assert "--ray, --placement and --stage-cpus need --stages" in capsys.readouterr().err
    assert main(args + ["--stages", "5"]) == 2
    assert "1 to 4 stages" in capsys.readouterr().err


def test_serve_arguments_take_stages():
    from needlepoint.command import build_parser

    args = build_parser().parse_args(["serve", "--stages", "0,7,14", "--ray", "10.0.0.1:6379",
                                      "--placement", "node_a,zone=b,node_c"])
    assert args.stages == [0, 7, 14] and args.ray == "10.0.0.1:6379"
    assert args.placement == ["node_a", "zone=b", "node_c"]
    assert build_parser().parse_args(["serve", "--stages", "3"]).stages == 3


def test_server_on_a_staged_model_answers_as_on_one_process():
    import openai
    from server_helpers import ServerThread, calls_of, openai_tools, user

    from needlepoint.server import create_app

    tools = openai_tools(json.loads(TOOLS.read_text()))
    answers = []
    staged = load_staged(toy_model_path(), 2, cache=False)
    try:
        for served in (needlepoint.load(toy_model_path()), staged):
            with ServerThread(create_app(served, model_name="toy")) as server:
                client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
                reply = client.chat.completions.create(
                    model="toy", messages=user("wake me up at 06:45"), tools=tools)
                answers.append(calls_of(reply.choices[0].message))
                assert server.health()["status"] == "ok"
    finally:
        staged.close()
    assert answers[1] == answers[0] == [("set_alarm", {"time": "06:45"})]


class _Recorder:
    """A transport wrapper that logs every submit and gather, in order."""

    def __init__(self, inner) -> None:
        self.inner, self.log = inner, []
        self.specs = inner.specs

    def submit(self, stage, method, *args):
        self.log.append(("submit", stage, method, args[-1] if method == "run" else None))
        return self.inner.submit(stage, method, *args)

    def gather(self, pending, timeout=None):
        self.log.append(("gather", len(pending)))
        return self.inner.gather(pending, timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_prefill_chunks_are_all_in_flight_and_only_the_last_reaches_the_lm_head():
    """A 100-token prefill in chunks of 16 on 3 stages: all 7 x 3 stage calls are submitted
    before the head waits for any (stage k can work on chunk i while stage k-1 works on
    chunk i+1), and only the last chunk asks the last stage for rows to read out."""
    ids = long_prompt("tiny", 100)
    with load_staged(fixture_path("tiny"), [0, 1, 3], cache=False) as staged:
        session = staged.session(chunk=16)
        staged.transport = recorder = _Recorder(staged.transport)
        assert_bits(session.prefill(ids), model("tiny").forward(ids)[-1])
        runs = [entry for entry in recorder.log if entry[0] == "submit"]
        assert recorder.log[: len(runs)] == runs and len(runs) == 7 * 3
        assert recorder.log[len(runs):] == [("gather", 7)]
        last_stage = [want for _, stage, _, want in runs if stage == 2]
        assert last_stage == ["none"] * 6 + ["last"]
        assert {want for _, stage, _, want in runs if stage != 2} == {None}


def test_stages_use_only_the_public_layer_range_interface_of_models():
    """`stages/` reaches models only through public names: the layer-range Protocol, the
    model Protocol, the part loader, the thread setting and model lookup; never a family's
    internals."""
    import ast

    # models.protocol: the one model interface, whose capabilities a staged model declares
    allowed = {"models.layer_range", "models.parts", "models.loader", "models.hub",
               "models.known", "models.protocol",
               "models.rewind"}  # rewind: the one rewind-count check (issue 27)
    for path in sorted((REPO_ROOT / "src" / "needlepoint" / "stages").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("models"):
                assert node.level == 2 and node.module in allowed, (path.name, node.module)
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert private == [], (path.name, private)
