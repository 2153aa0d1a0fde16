"""Depth-ladder rungs (`needlepoint.load(path, layers=k)`) against the fixtures' `rung{k}_*`."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NEEDLE3_FIXTURES, get_fixture
from v3_helpers import GREEDY_MARGIN, greedy, model, rms, trusted_steps

from needlepoint.errors import ModelInputError
from needlepoint.models.needle3.ladder import ladder_layer_indices

RUNGS = [
    (name, int(depth), index)
    for name in NEEDLE3_FIXTURES
    for depth, info in get_fixture("needle3", name).meta["rungs"].items()
    for index in info["prompts"]
]


def test_fixtures_have_rungs():
    assert {name for name, _, _ in RUNGS} == {"tiny", "small"}


@pytest.mark.parametrize("name,depth,index", RUNGS)
def test_rung_geometry(name, depth, index):
    info = get_fixture("needle3", name).meta["rungs"][str(depth)]
    net = model(name, "deploy", depth)
    assert list(net.layer_indices) == info["layers"]
    assert list(ladder_layer_indices(get_fixture("needle3", name).meta["config"]["num_layers"],
                                     depth)) == info["layers"]
    assert net.config.num_layers == depth
    assert list(net.config.global_layers) == info["global_layers"]
    assert list(net.config.engram_sites) == info["engram_layers"]


@pytest.mark.parametrize("name,depth,index", RUNGS)
def test_rung_deploy_logits(name, depth, index):
    arrays = get_fixture("needle3", name).arrays
    logits = model(name, "deploy", depth).forward(arrays[f"p{index}_tokens"])
    ref = arrays[f"rung{depth}_p{index}_logits_deploy"]
    rows = get_fixture("needle3", name).meta["oracle_self_consistency"]["deploy"]
    assert rms(logits - ref) <= 2 * max(row["rms"] for row in rows) + 0.01
    worst_agree = min(row["argmax_agree"] for row in rows)
    agree = np.mean(logits.argmax(-1) == ref.argmax(-1))
    assert agree >= worst_agree - max(0.05, 1.0 / len(ref)) - 1e-4


@pytest.mark.parametrize("mode", ("float", "deploy"))
@pytest.mark.parametrize("name,depth,index", RUNGS)
def test_rung_greedy(name, depth, index, mode):
    arrays = get_fixture("needle3", name).arrays
    tokens = greedy(model(name, mode, depth).session(), arrays[f"p{index}_tokens"])
    ref = arrays[f"rung{depth}_p{index}_greedy_{mode}"]
    trusted = trusted_steps(arrays[f"rung{depth}_p{index}_greedy_{mode}_margin"],
                            GREEDY_MARGIN[mode])
    np.testing.assert_array_equal(tokens[:trusted], ref[:trusted])


def test_ladder_rule_and_bounds():
    # README "Ladder": widest gap first, leftmost on ties
    assert ladder_layer_indices(20, 2) == (0, 19)
    assert ladder_layer_indices(20, 3) == (0, 9, 19)
    assert ladder_layer_indices(8, 5) == (0, 1, 3, 5, 7)
    assert ladder_layer_indices(4, 4) == (0, 1, 2, 3)
    with pytest.raises(ModelInputError):
        ladder_layer_indices(4, 5)
    with pytest.raises(ModelInputError):
        ladder_layer_indices(4, 1)
