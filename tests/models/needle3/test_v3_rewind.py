"""`session.rewind(n)` (speculative decoding's undo; docs/numerics.md): in deploy numerics
a rewound session is exactly the session that never consumed those positions: its next
logits, confidence logit and everything after are the same bits, across ring wrap-around."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import get_fixture
from v3_helpers import model

from needlepoint.errors import ModelInputError
from needlepoint.models.needle3.exact_attention import MAX_REWIND


def _tokens() -> np.ndarray:
    return get_fixture("needle3", "tiny").arrays["p3_tokens"]  # 256 tokens, past every window


@pytest.mark.parametrize("kv_window", [None, 48])
def test_rewind_is_exactly_never_having_consumed(kv_window):
    net = model("tiny")
    ids = _tokens()
    reference = net.session(kv_window=kv_window)
    expected = reference.extend(ids)
    session = net.session(kv_window=kv_window, chunk=19)
    session.prefill(ids[:60])
    position = 60
    rng = np.random.default_rng(0)
    while position < len(ids):
        k = int(rng.integers(1, 17))
        wrong = rng.integers(20, net.config.vocab, k)  # a rejected draft
        session.extend(wrong)
        session.rewind(k)
        assert session.position == position
        take = min(int(rng.integers(1, 12)), len(ids) - position)
        got = session.extend(ids[position : position + take])
        np.testing.assert_array_equal(got, expected[position : position + take])
        accepted = int(rng.integers(0, take + 1))  # rewind part of what was just accepted
        session.rewind(take - accepted)
        if accepted:
            position += accepted
        else:
            assert session.position == position
        np.testing.assert_array_equal(session.consumed(), ids[:position])
    np.testing.assert_array_equal(session.step(7), reference.step(7))


def test_rewound_confidence_logit_is_the_same_bits():
    net = model("tiny")
    ids = _tokens()[:150]
    straight = net.session()
    straight.prefill(ids)
    session = net.session()
    session.prefill(ids[:100])
    session.extend(np.full(40, 30))
    session.rewind(40)
    session.extend(ids[100:])
    assert session.confidence_logit() == straight.confidence_logit()
    np.testing.assert_array_equal(session.step(9), straight.step(9))


def test_rewind_limits_are_clear_errors():
    session = model("tiny").session()
    session.prefill(_tokens()[: MAX_REWIND + 10])
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ModelInputError):
            session.rewind(bad)
    with pytest.raises(ModelInputError, match="at most"):
        session.rewind(MAX_REWIND + 1)
    with pytest.raises(ModelInputError, match="only"):
        model("tiny").session().rewind(1)
    session.rewind(0)
    assert session.position == MAX_REWIND + 10


def test_float_sessions_rewind_by_rebuilding():
    net = model("tiny", "float")
    ids = _tokens()[:80]
    session = net.session()
    session.prefill(ids[:70])
    session.extend(np.full(5, 42))
    session.rewind(5)
    assert session.position == 70
    straight = net.session()
    straight.prefill(ids[:70])
    np.testing.assert_allclose(session.extend(ids[70:]), straight.extend(ids[70:]), atol=1e-4)
