"""The one model interface (`models/protocol.py`): every family implements it, `kv_window`
means the same everywhere, one name resolution; transformer sessions `extend` / `rewind`
exactly in int8 numerics (rewind cuts the KV cache)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import get_fixture, toy_model_path
from hf_helpers import hf_fixture_dir, hf_reference

import needlepoint
from needlepoint.errors import ModelInputError, TokenizerError
from needlepoint.models.protocol import (
    ModelCapabilities,
    ModelNotFoundError,
    SessionCapabilities,
    SessionProtocol,
    resolve_model_name,
)

IDS = [5, 17, 42, 7, 99, 3, 250, 11, 64, 8]


@pytest.fixture(scope="module")
def tiny_int8():
    return needlepoint.load(hf_fixture_dir("llama-tiny"), numerics="int8")


# Each family through the Protocol's methods, against its fixture's reference logits (float
# numerics; each tolerance is the family's parity test's: fixtures/needle3 and needle2 READMEs
# "How strictly to compare", transformers 1e-4 as tests/models/transformer). A model cut into
# stages is a family too.
FAMILIES = {
    "needle3": (lambda: get_fixture("needle3", "tiny").cact, {"numerics": "float"},
                lambda: get_fixture("needle3", "tiny").arrays, "p1_tokens", "p1_logits_float",
                2e-3),
    "needle2": (lambda: get_fixture("needle2", "tiny").cact, {},
                lambda: get_fixture("needle2", "tiny").arrays, "p1_ids", "p1_logits", 2e-3),
    "llama": (lambda: hf_fixture_dir("llama-tiny"), {"numerics": "float"},
              lambda: hf_reference("llama-tiny").arrays, "p1_ids", "p1_logits", 1e-4),
    "gpt2": (lambda: hf_fixture_dir("gpt2-tiny"), {"numerics": "float"},
             lambda: hf_reference("gpt2-tiny").arrays, "p1_ids", "p1_logits", 1e-4),
    "needle3 in stages": (lambda: get_fixture("needle3", "tiny").cact,
                          {"numerics": "float", "stages": 2},
                          lambda: get_fixture("needle3", "tiny").arrays, "p1_tokens",
                          "p1_logits_float", 2e-3),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_the_protocol_to_its_reference_logits(family) -> None:
    """Every method `ModelProtocol` / `SessionProtocol` declare, run (not only present):
    forward, a session's prefill / step / extend / rewind / position, run_batch, check_ids."""
    path, options, arrays, ids_key, logits_key, tolerance = FAMILIES[family]
    ids = [int(t) for t in arrays()[ids_key]]
    ref = arrays()[logits_key][: len(ids)]  # Needle 2's rows go on over its greedy tokens

    def close(got, want) -> None:
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) <= tolerance

    model = needlepoint.load(path(), **options)
    try:
        close(model.forward(ids), ref)
        session = model.session()
        assert isinstance(session, SessionProtocol) and session.position == 0
        close(session.prefill(ids[:-3]), ref[-4])
        assert session.position == len(ids) - 3
        close(session.step(ids[-3]), ref[-3])
        close(session.extend(ids[-2:]), ref[-2:])
        session.rewind(2)
        assert session.position == len(ids) - 2
        close(session.extend(ids[-2:]), ref[-2:])  # the rewound positions left no trace
        whole, head = model.run_batch([(model.session(), ids, True),
                                       (model.session(), ids[:5], False)])
        close(whole, ref)
        close(head, ref[4])
        np.testing.assert_array_equal(model.check_ids(ids), ids)
        with pytest.raises(ModelInputError):
            model.check_ids([ref.shape[-1] + 7])  # no such token
    finally:
        if hasattr(model, "close"):
            model.close()


def test_chat_formats_of_the_families() -> None:
    """A chat model's format knows its end-of-turn ids; a base model without a chat template
    says so when asked (TokenizerError), not later in a turn."""
    for model in (needlepoint.load(toy_model_path()),
                  needlepoint.load(get_fixture("needle2", "tiny").cact),
                  needlepoint.load(hf_fixture_dir("llama-tiny"))):
        assert model.chat_format.end_ids
    gpt2 = needlepoint.load(hf_fixture_dir("gpt2-tiny"))
    with pytest.raises(TokenizerError, match="no chat template"):
        _ = gpt2.chat_format
    staged = needlepoint.load(toy_model_path(), stages=2)
    try:
        assert staged.chat_format.name == "needle"
    finally:
        staged.close()


def test_every_family_declares_its_capabilities(tiny_int8) -> None:
    """What `api/`, `generation/` and `server/` read instead of probing (issue 27 item 3):
    each declared capability is one the object really has, and what each family lacks is
    declared absent."""
    deploy = needlepoint.load(toy_model_path())
    float_toy = needlepoint.load(toy_model_path(), numerics="float")
    needle2 = needlepoint.load(get_fixture("needle2", "tiny").cact)
    float_tf = needlepoint.load(hf_fixture_dir("llama-tiny"), numerics="float")
    for model in (deploy, float_toy, needle2, tiny_int8, float_tf):
        caps, session = model.capabilities, model.session()
        assert isinstance(caps, ModelCapabilities) and caps.run_batch
        assert caps.pipeline_depth == 1 and caps.name
        assert caps.confidence_head == (model.confidence_logit(IDS) is not None)
        sc = session.capabilities
        assert isinstance(sc, SessionCapabilities) and sc.extend and sc.rewind and sc.fork
        session.prefill(IDS[:4], logits=False)
        fork = session.fork()
        rows = fork.extend(IDS[4:6])
        fork.rewind(2)
        assert rows.shape[0] == 2 and fork.position == 4 == session.position
        if sc.confidence:
            session.confidence_logit()
        if sc.chunk is not None:
            assert sc.chunk == session.chunk > 0
    assert deploy.session().capabilities.exact and tiny_int8.session().capabilities.exact
    assert not any(m.session().capabilities.exact for m in (float_toy, needle2, float_tf))
    assert needle2.capabilities.embedding == needle2.has_contrastive_head
    assert needle2.embed("lock the door").shape[-1] > 0
    assert not deploy.capabilities.embedding and not tiny_int8.capabilities.embedding
    assert deploy.capabilities.name == toy_model_path().stem
    staged = needlepoint.load(toy_model_path(), stages=2)
    try:
        caps = staged.capabilities
        assert caps.pipeline_depth == 2 and caps.run_batch and caps.name == deploy.capabilities.name
        assert staged.session().capabilities.exact
    finally:
        staged.close()


def test_int8_extend_is_steps_and_rewind_cuts_the_cache(tiny_int8) -> None:
    steps = tiny_int8.session()
    rows = [steps.prefill(IDS[:4])] + [steps.step(t) for t in IDS[4:]]  # positions 3..9
    session = tiny_int8.session()
    assert session.capabilities.exact and not needlepoint.load(
        hf_fixture_dir("llama-tiny"), numerics="float").session().capabilities.exact
    session.prefill(IDS[:3], logits=False)
    assert np.array_equal(session.extend(IDS[3:]), np.stack(rows))  # same bits as steps
    session.rewind(4)
    assert session.position == len(IDS) - 4
    again = session.extend([1, 2, 3])
    fresh = tiny_int8.session().extend(IDS[:-4] + [1, 2, 3])
    assert np.array_equal(again, fresh[-3:])  # the cut rows left no trace
    with pytest.raises(ValueError):
        session.rewind(session.position + 1)


def test_run_batch_equals_running_alone(tiny_int8) -> None:
    a, b = tiny_int8.session(), tiny_int8.session()
    out = tiny_int8.run_batch([(a, IDS[:5], True), (b, IDS[:3], False)])
    assert np.array_equal(out[0], tiny_int8.session().extend(IDS[:5]))
    assert np.array_equal(out[1], tiny_int8.session().prefill(IDS[:3]))


def test_kv_window_has_one_meaning(tiny_int8) -> None:
    limit = tiny_int8.config.max_seq_len
    tiny_int8.session(kv_window=None)
    tiny_int8.session(kv_window=limit)  # a window that never bounds anything
    with pytest.raises(ModelInputError, match="whole context"):
        tiny_int8.session(kv_window=limit - 1)
    with pytest.raises(ModelInputError):
        tiny_int8.session(kv_window=0)
    needle3 = needlepoint.load(toy_model_path())
    assert needle3.session(kv_window=8).kv_window == 8


def test_one_name_resolution(tmp_path) -> None:
    folder = hf_fixture_dir("llama-tiny")
    assert resolve_model_name(folder) == folder
    assert resolve_model_name(str(toy_model_path())) == toy_model_path()
    with pytest.raises(ModelNotFoundError, match="known name: smollm2"):
        resolve_model_name(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model_name(tmp_path)
    needle = needlepoint.Needle(model=str(folder), cache=None)  # Needle(model=...) uses it
    assert needle.format.name == "template"
