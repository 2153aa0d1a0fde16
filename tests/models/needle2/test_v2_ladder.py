"""Needle 2 depth ladder (`needlepoint.load(path, layers=N)`).

The Needle 2 fixtures carry no rung references, so the rule is upstream's
`ladder_layer_indices` as the needle3 README "Ladder" states it; the kept-block lists are
checked against the needle3 fixtures' recorded rungs, which that same function produced.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NEEDLE2_FIXTURES, NEEDLE3_FIXTURES, get_fixture, model_loader

import needlepoint
from needlepoint.models.needle2.ladder import ladder_layer_indices


@pytest.fixture(scope="module")
def full_model():
    return model_loader("needle2")


@pytest.mark.parametrize("name", [n for n in NEEDLE3_FIXTURES if n != "shipped"])
def test_indices_match_upstream_rungs(name):
    meta = get_fixture("needle3", name).meta
    layers = meta["config"]["num_layers"]
    assert meta["rungs"]
    for depth, rung in meta["rungs"].items():
        assert list(ladder_layer_indices(layers, int(depth))) == rung["layers"]


def test_indices_rule():
    assert ladder_layer_indices(27, 2) == (0, 26)
    assert ladder_layer_indices(27, 3) == (0, 13, 26)
    assert ladder_layer_indices(27, 5) == (0, 6, 13, 19, 26)  # leftmost widest gap first
    assert ladder_layer_indices(6, 4) == (0, 2, 3, 5)
    assert ladder_layer_indices(6, 6) == tuple(range(6))


@pytest.mark.parametrize("name", NEEDLE2_FIXTURES)
def test_full_depth_is_the_full_model(full_model, name):
    fx = get_fixture("needle2", name)
    layers = fx.meta["header"]["num_layers"]
    rung = needlepoint.load(fx.cact, layers=layers)
    full = full_model(name)
    assert rung.config == full.config and rung.layer_indices == tuple(range(layers))
    ids = fx.arrays["p0_ids"]
    assert np.array_equal(rung.forward(ids), full.forward(ids))
    assert rung.confidence_logit(ids) == full.confidence_logit(ids)


@pytest.mark.parametrize("bad", [0, 1, 5, -2, 2.0, True, "3"])
def test_invalid_depth_raises(bad):
    with pytest.raises(ValueError):
        needlepoint.load(get_fixture("needle2", "tiny").cact, layers=bad)


@pytest.mark.parametrize(("depth", "kept", "sites"), [(2, (0, 3), (1,)), (3, (0, 1, 3), (1, 2))])
def test_rung_keeps_blocks_and_remaps_sites(full_model, depth, kept, sites):
    """tiny: 4 layers, engram at layers 1 and 3. Kept blocks renumber; a site at a dropped
    layer goes, the others follow their block; lane offsets follow the new index."""
    full = full_model("tiny")
    rung = needlepoint.load(get_fixture("needle2", "tiny").cact, layers=depth)
    assert rung.layer_indices == kept
    assert rung.config.num_layers == depth and rung.config.engram_sites == sites
    lanes = rung.config.mhc_lanes
    for new, old in enumerate(kept):
        assert np.array_equal(rung.weights.layers[new].w_qkvg, full.weights.layers[old].w_qkvg)
        assert np.array_equal(rung.weights.mhc[new].phi, full.weights.mhc[old].phi)
        # hpre offset 8*onehot(i mod n) - 4: +4 on the block's own lane, -4 elsewhere.
        own = np.where(np.arange(lanes) == new % lanes, 4.0, -4.0)
        was = np.where(np.arange(lanes) == old % lanes, 4.0, -4.0)
        offset = rung.weights.mhc[new].bias_pre - full.weights.mhc[old].bias_pre
        assert np.allclose(offset, own - was, atol=1e-5)
    kept_sites = [s for s, layer in enumerate(full.config.engram_sites) if layer in kept]
    for site, source in zip(rung.weights.engrams, kept_sites, strict=True):
        assert np.array_equal(site.w_kv, full.weights.engrams[source].w_kv)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_rung_runs_consistently(name):
    fx = get_fixture("needle2", name)
    rung = needlepoint.load(fx.cact, layers=3)
    ids, gen = fx.arrays["p1_ids"], fx.arrays["p1_gen_ids"][:4]
    session = rung.session()
    rows = [session.prefill(ids)] + [session.step(int(t)) for t in gen]
    batched = rung.forward(np.concatenate([ids, gen]))[len(ids) - 1 :]
    assert np.isfinite(batched).all()
    assert np.abs(np.array(rows) - batched).max() <= 1e-4
    assert rung.hidden_cells(ids).shape == (len(ids), 4, fx.meta["header"]["d_model"])
    assert np.isfinite(rung.confidence_logit(ids))
    assert abs(float(np.linalg.norm(rung.embed(ids))) - 1.0) < 1e-5
