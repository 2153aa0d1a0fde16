"""Needle 2 parity with the upstream reference on every fixture and prompt.

Reference: `shared/fixtures/needle2/README.md` ("Arrays in NAME.npz", "Tolerances"). The
reference is float32 with no KV or activation quantisation, which is what a v2 model runs
under the default numerics. Everything is asserted against the fixture arrays.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NEEDLE2_FIXTURES, get_fixture, model_loader

from needlepoint.models.needle2.trace import LadderRecorder

# Tolerances shared with Needle 3 (README "Tolerances": a float32 engine lands near 1e-4).
MAX_ABS = 2e-3
MEAN_ABS = 2e-4
HEAD_ABS = 1e-4  # confidence logit, contrastive components
# Ladder stages: max |delta| relative to the stage's magnitude (seen: <= 3e-6).
LADDER_REL = 2e-5
# Prefill vs token-by-token stepping: the same arithmetic in a different BLAS/summation
# order (GEMM over a chunk vs GEMV per token, softmax over ring + chunk keys). Bound,
# relative to the largest logit: seen <= 8e-7 (1.8e-5 absolute on shipped, |logit| ~ 25).
PREFILL_STEP_REL = 2e-6

# Ladder stages whose first axis is the position (the others lead with layer/site/KV head).
POSITION_FIRST = ("ladder_embedding_rows", "ladder_final_lane_mean", "ladder_final_hidden")

CASES = [
    pytest.param(name, k, id=f"{name}-p{k}")
    for name in NEEDLE2_FIXTURES
    for k in range(len(get_fixture("needle2", name).meta["prompts"]))
]
LADDER_CASES = [
    pytest.param(name, p["index"], id=f"{name}-p{p['index']}")
    for name in NEEDLE2_FIXTURES
    for p in get_fixture("needle2", name).meta["prompts"]
    if "ladder_positions" in p
]


@pytest.fixture(scope="module")
def model_of():
    return model_loader("needle2")


@pytest.fixture(scope="module")
def greedy_run(model_of):
    """Per (fixture, prompt): prompt logits from one batched prefill, then free-running
    greedy decode exactly as the reference (stop before EOS or after n_new tokens)."""
    cache: dict[tuple[str, int], tuple[np.ndarray, list[int]]] = {}

    def get(name: str, k: int):
        if (name, k) not in cache:
            fx = get_fixture("needle2", name)
            eos = fx.meta["tokenizer"]["special_ids"]["eos"]
            session = model_of(name).session()
            rows = [session.prefill_all(fx.arrays[f"p{k}_ids"])]
            gen: list[int] = []
            for _ in range(fx.meta["n_new_tokens"]):
                nxt = int(np.argmax(rows[-1][-1]))
                if nxt == eos:
                    break
                gen.append(nxt)
                rows.append(session.step(nxt)[None])
            cache[(name, k)] = (np.concatenate(rows), gen)
        return cache[(name, k)]

    return get


def _assert_close_logits(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    delta = np.abs(ours - ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs {ref.shape}"
    worst = np.unravel_index(np.argmax(delta), delta.shape)
    assert delta.max() <= MAX_ABS, f"{what}: max |d| {delta.max():.2e} at row/col {worst}"
    assert delta.mean() <= MEAN_ABS, f"{what}: mean |d| {delta.mean():.2e}"


@pytest.mark.parametrize(("name", "k"), CASES)
def test_greedy_ids_match(greedy_run, name, k):
    fx = get_fixture("needle2", name)
    _, gen = greedy_run(name, k)
    ref = fx.arrays[f"p{k}_gen_ids"].tolist()
    if gen != ref:
        pairs = zip(gen + [-1], ref + [-1], strict=False)
        j = next(i for i, (a, b) in enumerate(pairs) if a != b)
        s = len(fx.arrays[f"p{k}_ids"])
        margin = fx.arrays[f"p{k}_margin"][s - 1 + j]
        pytest.fail(f"greedy ids diverge at step {j} (reference top-2 margin {margin:.2e})")


@pytest.mark.parametrize(("name", "k"), CASES)
def test_logits_every_position(greedy_run, name, k):
    """Rows 0..S-1 from the batched prefill, rows S+j from the decode steps."""
    fx = get_fixture("needle2", name)
    rows, gen = greedy_run(name, k)
    assert gen == fx.arrays[f"p{k}_gen_ids"].tolist(), "greedy diverged: rows not comparable"
    _assert_close_logits(rows, fx.arrays[f"p{k}_logits"], f"{name} p{k}")


@pytest.mark.parametrize(("name", "k"), CASES)
def test_forward_whole_sequence(model_of, name, k):
    """`model.forward` over prompt + greedy ids in one batched call (teacher forced)."""
    fx = get_fixture("needle2", name)
    ids = np.concatenate([fx.arrays[f"p{k}_ids"], fx.arrays[f"p{k}_gen_ids"]])
    logits = model_of(name).forward(ids)
    assert logits.dtype == np.float32
    _assert_close_logits(logits, fx.arrays[f"p{k}_logits"], f"{name} p{k} forward")


@pytest.mark.parametrize(("name", "k"), CASES)
def test_probe_heads(model_of, name, k):
    fx = get_fixture("needle2", name)
    model = model_of(name)
    ids = fx.arrays[f"p{k}_ids"]
    full = np.concatenate([ids, fx.arrays[f"p{k}_gen_ids"]])
    for seq, suffix in ((ids, ""), (full, "_full")):
        conf = model.confidence_logit(seq)
        ref_conf = float(fx.arrays[f"p{k}_confidence{suffix}"])
        assert isinstance(conf, float)
        assert abs(conf - ref_conf) <= HEAD_ABS, f"confidence{suffix}: {conf} vs {ref_conf}"
        emb = model.embed(seq)
        ref_emb = fx.arrays[f"p{k}_contrastive{suffix}"]
        assert emb.shape == ref_emb.shape and emb.dtype == np.float32
        assert np.abs(emb - ref_emb).max() <= HEAD_ABS, f"contrastive{suffix}"
        assert abs(float(np.linalg.norm(emb)) - 1.0) < 1e-5


@pytest.mark.parametrize("name", NEEDLE2_FIXTURES)
def test_embed_text_uses_bos_plus_encode(model_of, name):
    """`embed(str)` scores `[BOS] + encode(text)`, as the fixture's contrastive arrays."""
    fx = get_fixture("needle2", name)
    model = model_of(name)
    k = max(range(len(fx.meta["prompts"])), key=lambda i: fx.meta["prompts"][i]["prompt_len"])
    text = fx.meta["prompts"][k]["text"]
    emb = model.embed(text)
    assert np.abs(emb - fx.arrays[f"p{k}_contrastive"]).max() <= HEAD_ABS


@pytest.mark.parametrize("name", NEEDLE2_FIXTURES)
def test_prefill_then_step_equals_stepping(model_of, name):
    """A batched prefill leaves the same state as feeding the prompt token by token."""
    fx = get_fixture("needle2", name)
    model = model_of(name)
    k = max(range(len(fx.meta["prompts"])), key=lambda i: fx.meta["prompts"][i]["prompt_len"])
    ids, gen = fx.arrays[f"p{k}_ids"], fx.arrays[f"p{k}_gen_ids"][:4]
    batched, stepped = model.session(), model.session()
    a = [batched.prefill(ids)] + [batched.step(int(t)) for t in gen]
    b = [stepped.step(int(t)) for t in ids][-1:] + [stepped.step(int(t)) for t in gen]
    a, b = np.array(a), np.array(b)
    bound = PREFILL_STEP_REL * np.abs(a).max()
    assert np.abs(a - b).max() <= bound, f"{np.abs(a - b).max():.2e} > {bound:.2e}"
    assert (a.argmax(-1) == b.argmax(-1)).all()
    assert batched.position == stepped.position == len(ids) + len(gen)


@pytest.mark.parametrize(("name", "k"), LADDER_CASES)
def test_parity_ladder(model_of, name, k):
    """Every traced intermediate of the prompt's prefill against `p{k}_ladder_*`."""
    fx = get_fixture("needle2", name)
    positions = next(p for p in fx.meta["prompts"] if p["index"] == k)["ladder_positions"]
    recorder = LadderRecorder()
    session = model_of(name).session(trace=recorder)
    logits = session.prefill(fx.arrays[f"p{k}_ids"])
    ours = recorder.arrays()
    prefix = f"p{k}_"
    stems = sorted(key[len(prefix) :] for key in fx.arrays.files if key.startswith(prefix + "lad"))
    assert stems and set(stems) <= set(ours)
    for stem in stems:
        ref = fx.arrays[prefix + stem]
        mine = ours[stem]
        mine = mine[:positions] if stem in POSITION_FIRST else mine[:, :positions]
        assert mine.shape == ref.shape, f"{stem}: {mine.shape} vs {ref.shape}"
        bound = LADDER_REL * max(1.0, float(np.abs(ref).max()))
        delta = float(np.abs(mine - ref).max())
        assert delta <= bound, f"{stem}: max |d| {delta:.2e} > {bound:.2e}"
    # The traced run is the real prefill: its logits are the fixture's last prompt row.
    s = len(fx.arrays[f"p{k}_ids"])
    assert np.abs(logits - fx.arrays[f"p{k}_logits"][s - 1]).max() <= MAX_ABS


def test_trace_order(model_of):
    """Per chunk: embedding, engram, per layer lanes..hres, final lanes, heads of the LM."""
    model = model_of("tiny")
    recorder = LadderRecorder()
    model.session(trace=recorder).step(5)
    per_layer = [
        "ladder_lanes",
        "ladder_hpre",
        "ladder_block_in",
        "ladder_attn_out",
        "ladder_mlp_out",
        "ladder_block_out",
        "ladder_hpost",
        "ladder_hres",
    ]
    expected = ["ladder_embedding_rows", "ladder_engram_k", "ladder_engram_v"]
    for layer in range(model.config.num_layers):
        names = list(per_layer)
        if layer in model.config.engram_sites:
            names.insert(2, "ladder_engram_alpha")
        if layer == 0:
            names[names.index("ladder_attn_out") : names.index("ladder_attn_out")] = [
                "ladder_k_cache_l0",
                "ladder_v_cache_l0",
            ]
        expected += names
    expected += ["ladder_lanes", "ladder_final_lane_mean", "ladder_final_hidden", "logits"]
    assert recorder.order == expected
