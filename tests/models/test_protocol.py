"""The one model interface (`models/protocol.py`): every family implements it, `kv_window`
means the same everywhere, one name resolution; transformer sessions `extend` / `rewind`
exactly in int8 numerics (rewind cuts the KV cache)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import get_fixture, toy_model_path
from hf_helpers import hf_fixture_dir

import needlepoint
from needlepoint.errors import ModelInputError, TokenizerError
from needlepoint.models.protocol import (
    ModelCapabilities,
    ModelNotFoundError,
    ModelProtocol,
    SessionCapabilities,
    SessionProtocol,
    resolve_model_name,
)

IDS = [5, 17, 42, 7, 99, 3, 250, 11, 64, 8]


@pytest.fixture(scope="module")
def tiny_int8():
    return needlepoint.load(hf_fixture_dir("llama-tiny"), numerics="int8")


def test_every_family_implements_the_protocol(tiny_int8) -> None:
    models = [needlepoint.load(toy_model_path()),
              needlepoint.load(get_fixture("needle2", "tiny").cact), tiny_int8]
    for model in models:
        assert isinstance(model, ModelProtocol), model
        assert isinstance(model.session(), SessionProtocol), model
        assert model.chat_format.end_ids
    gpt2 = needlepoint.load(hf_fixture_dir("gpt2-tiny"))  # a base model: no chat template
    assert isinstance(gpt2.session(), SessionProtocol)
    with pytest.raises(TokenizerError, match="no chat template"):
        _ = gpt2.chat_format
    staged = needlepoint.load(toy_model_path(), stages=2)
    try:
        assert isinstance(staged, ModelProtocol) and staged.chat_format.name == "needle"
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
    assert session.exact_extend and not needlepoint.load(
        hf_fixture_dir("llama-tiny"), numerics="float").session().exact_extend
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
