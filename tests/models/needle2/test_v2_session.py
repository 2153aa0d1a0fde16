"""Needle 2 sessions: kv-window override, full-causal heads, the cache-too-small error
(seed 002 `set_kv_window`), input errors, independence, and the `load()` surface."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import NEEDLE2_FIXTURES, get_fixture

import needlepoint
from needlepoint import ModelInputError
from needlepoint.formats.needle2_geometry import V2Config
from needlepoint.models.needle2.heads import confidence_logit
from needlepoint.models.needle2.model import V2Model

MAX_ABS = 2e-3
MEAN_ABS = 2e-4
HEAD_ABS = 1e-4


@pytest.fixture(scope="module")
def tiny() -> V2Model:
    return needlepoint.load(get_fixture("needle2", "tiny").cact)


def _long_prompt(name: str = "tiny") -> tuple[int, np.ndarray, np.ndarray]:
    """The fixture's longest prompt (crosses the window) and its greedy ids."""
    fx = get_fixture("needle2", name)
    k = max(range(len(fx.meta["prompts"])), key=lambda i: fx.meta["prompts"][i]["prompt_len"])
    return k, fx.arrays[f"p{k}_ids"], fx.arrays[f"p{k}_gen_ids"]


def test_load_surface(tiny):
    fx = get_fixture("needle2", "tiny")
    assert isinstance(tiny, V2Model) and tiny.generation == 2
    assert isinstance(tiny.config, V2Config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.config.kv_window = 3  # type: ignore[misc]
    assert tiny.config.kv_window == fx.meta["header"]["kv_window"]
    assert tiny.tokenizer is tiny.archive.tokenizer
    assert tiny.numerics == "deploy" and tiny.has_confidence_head and tiny.has_contrastive_head


@pytest.mark.parametrize("name", NEEDLE2_FIXTURES)
def test_float_numerics_equals_deploy(name):
    """v2 "deploy" is what the reference decoder runs: float KV and activations."""
    path = get_fixture("needle2", name).cact
    ids = get_fixture("needle2", name).arrays["p0_ids"]
    deploy = needlepoint.load(path).forward(ids)
    assert np.array_equal(needlepoint.load(path, numerics="float").forward(ids), deploy)
    with pytest.raises(ValueError):
        needlepoint.load(path, numerics="int4")


def test_default_window_is_the_headers(tiny):
    session = tiny.session()
    assert session.kv_window == tiny.config.kv_window == 32
    assert session.cache_len == 32
    assert tiny.session(kv_window=0).cache_len == tiny.config.max_seq_len


def test_bigger_ring_same_window_matches_reference(tiny):
    """A ring larger than the window must still mask to the window (and match the fixture)."""
    k, ids, gen = _long_prompt()
    ref = get_fixture("needle2", "tiny").arrays[f"p{k}_logits"]
    session = tiny.session(cache_len=100)
    rows = [session.prefill_all(ids)] + [session.step(int(t))[None] for t in gen]
    delta = np.abs(np.concatenate(rows) - ref)
    assert delta.max() <= MAX_ABS and delta.mean() <= MEAN_ABS


def test_window_override_matches_batched_forward(tiny):
    """`session(kv_window=W)` decodes what `forward(ids, kv_window=W)` computes, and a
    different window really changes the logits past the header's window."""
    k, ids, gen = _long_prompt()
    seq = np.concatenate([ids, gen])
    for window in (0, 64):
        session = tiny.session(kv_window=window)
        assert session.kv_window == window
        rows = [session.prefill_all(ids)] + [session.step(int(t))[None] for t in gen]
        batched = tiny.forward(seq, kv_window=window)
        assert np.abs(np.concatenate(rows) - batched).max() <= 1e-4
    default = tiny.forward(seq)
    full = tiny.forward(seq, kv_window=0)
    window = tiny.config.kv_window
    assert np.array_equal(default[:window], full[:window])
    assert np.abs(default[window + 8 :] - full[window + 8 :]).max() > 1e-2


def test_heads_need_full_causal(tiny):
    """The fixture's heads are full causal: cells of a windowed pass give another logit."""
    k, ids, _ = _long_prompt()
    ref = float(get_fixture("needle2", "tiny").arrays[f"p{k}_confidence"])
    cfg = tiny.config
    for window, should_match in ((0, True), (cfg.kv_window, False)):
        cells = np.empty((ids.size, cfg.num_layers + 1, cfg.d_model), np.float32)
        tiny.session(kv_window=window).prefill(ids, logits=False, cells=cells)
        logit = confidence_logit(cells, tiny.weights.confidence)
        assert (abs(logit - ref) <= HEAD_ABS) == should_match
    windowed = tiny.session()
    windowed.prefill(ids)
    assert abs(windowed.confidence_logit() - ref) <= HEAD_ABS  # recomputed full causal


def test_cache_too_small_is_a_clear_error(tiny):
    session = tiny.session()  # ring of kv_window = 32 positions
    with pytest.raises(ModelInputError, match="cache"):
        session.set_kv_window(0)
    with pytest.raises(ModelInputError, match="cache"):
        session.set_kv_window(64)
    session.set_kv_window(16)  # a narrower window fits
    assert session.kv_window == 16
    session.set_kv_window(None)
    assert session.kv_window == 32
    with pytest.raises(ModelInputError, match="cache"):
        tiny.session(kv_window=64, cache_len=32)
    with pytest.raises(ModelInputError, match="cache"):
        tiny.session(kv_window=0, cache_len=100)
    for bad in (-1, 1.5, True):
        with pytest.raises(ModelInputError):
            tiny.session(kv_window=bad)


def test_narrowed_window_on_a_bigger_ring(tiny):
    """set_kv_window(16) on a 32-slot ring equals a session opened at 16."""
    _, ids, gen = _long_prompt()
    narrowed, opened = tiny.session(), tiny.session(kv_window=16)
    narrowed.set_kv_window(16)
    a = [narrowed.prefill(ids)] + [narrowed.step(int(t)) for t in gen[:4]]
    b = [opened.prefill(ids)] + [opened.step(int(t)) for t in gen[:4]]
    assert np.abs(np.array(a) - np.array(b)).max() <= 1e-4


def test_bad_token_ids(tiny):
    vocab = tiny.config.vocab
    session = tiny.session()
    for bad in ([], [vocab], [-1], [[1, 2]], [1.5], ["a"]):
        with pytest.raises(ModelInputError):
            session.prefill(bad)
        with pytest.raises(ModelInputError):
            tiny.forward(bad)
    for bad in (vocab, -1, 2.0, None):
        with pytest.raises(ModelInputError):
            session.step(bad)
    with pytest.raises(ModelInputError):
        tiny.confidence_logit([2, vocab])
    with pytest.raises(ModelInputError):
        tiny.embed([2, vocab + 7])
    assert session.position == 0  # nothing was consumed by a rejected call
    session.step(np.int32(5))
    assert session.position == 1


def test_too_long_sequences(tiny):
    limit = tiny.config.max_seq_len
    with pytest.raises(ModelInputError, match="max_seq_len"):
        tiny.forward([5] * (limit + 1))
    with pytest.raises(ModelInputError, match="max_seq_len"):
        tiny.session().prefill([5] * (limit + 1))
    session = tiny.session()
    session.prefill([5] * (limit - 1), logits=False)
    with pytest.raises(ModelInputError, match="max_seq_len"):
        session.prefill([5, 5])
    assert session.position == limit - 1
    session.step(5)
    with pytest.raises(ModelInputError, match="max_seq_len"):
        session.step(5)


def test_prefill_without_logits_skips_the_head_only(tiny):
    _, ids, gen = _long_prompt()
    quiet, loud = tiny.session(), tiny.session()
    assert quiet.prefill(ids, logits=False) is None
    loud.prefill(ids)
    assert np.array_equal(quiet.step(int(gen[0])), loud.step(int(gen[0])))


def test_split_prefill_matches_one_prefill(tiny):
    _, ids, gen = _long_prompt()
    whole, split = tiny.session(), tiny.session()
    whole.prefill(ids)
    for part in (ids[:7], ids[7:40], ids[40:]):
        last = split.prefill(part)
    assert np.abs(last - tiny.forward(ids)[-1]).max() <= 1e-4
    assert np.abs(whole.step(int(gen[0])) - split.step(int(gen[0]))).max() <= 1e-4
    assert np.array_equal(split.tokens, np.concatenate([ids, gen[:1]]))


def test_sessions_are_independent(tiny):
    _, ids, gen = _long_prompt()
    a, b = tiny.session(), tiny.session()
    alone = tiny.session()
    ref = [alone.prefill(ids[:20])] + [alone.step(int(t)) for t in gen[:5]]
    out_a = [a.prefill(ids[:20])]
    b.prefill(ids[:50])  # interleave another sequence
    for t in gen[:5]:
        out_a.append(a.step(int(t)))
        b.step(int(t))
    assert all(np.array_equal(x, y) for x, y in zip(out_a, ref, strict=True))


def test_fork(tiny):
    _, ids, gen = _long_prompt()
    base, reference = tiny.session(), tiny.session()
    base.prefill(ids[:30])
    reference.prefill(ids[:30])
    branch = base.fork()
    assert branch.position == base.position == 30
    branch.step(int(gen[1]))  # the branch diverges first...
    branch.step(int(gen[2]))
    # ...and leaves the original untouched.
    assert np.array_equal(base.step(int(gen[0])), reference.step(int(gen[0])))
    assert (branch.position, base.position) == (32, 31)


def test_extend_and_rewind(tiny):
    ids = get_fixture("needle2", "tiny").arrays["p1_ids"]
    straight = tiny.session()
    expected = straight.extend(ids)
    session = tiny.session()
    session.prefill(ids[:5])
    session.extend([30, 31, 32])
    session.rewind(3)
    assert session.position == 5
    np.testing.assert_allclose(session.extend(ids[5:]), expected[5:], atol=1e-4)
    with pytest.raises(ModelInputError):
        session.rewind(session.position + 1)
