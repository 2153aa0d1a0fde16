"""The one-pass engine step (issue 26 items 2, 3): `run_batch` of 16 decoding sessions at 2
threads, whose attention rows of every session run in one split on the native worker pool
(np_v3_blocks -> np_v3_attend_parts; long enough contexts that the split is threaded), gives
each session's logits bit for bit as that session decoding alone on one thread."""

from __future__ import annotations

import numpy as np
from conftest import toy_model_path

import needlepoint
from needlepoint.models.needle3.native_block import native_plan


def test_sixteen_sessions_at_two_threads_equal_each_alone_at_one() -> None:
    one = needlepoint.load(toy_model_path(), cache=False, threads=1)
    two = needlepoint.load(toy_model_path(), cache=False, threads=2)
    assert native_plan(two) is not None and native_plan(two).model.threads == 2
    rng = np.random.default_rng(26)
    # 16 x 4 heads x ~140 keys x (32 + 32): above the step's threshold for splitting (2^19)
    prompts = [rng.integers(1, one.config.vocab, 130 + i) for i in range(16)]
    steps = rng.integers(1, one.config.vocab, (3, 16))
    batch = [two.session() for _ in prompts]
    got = [two.run_batch([(s, p, False) for s, p in zip(batch, prompts, strict=True)])]
    for row in steps:
        got.append(two.run_batch([(s, [int(t)], False)
                                  for s, t in zip(batch, row, strict=True)]))
    for i, prompt in enumerate(prompts):
        alone = one.session()
        expected = [alone.prefill(prompt)] + [alone.step(int(t)) for t in steps[:, i]]
        for round_logits, want in zip(got, expected, strict=True):
            np.testing.assert_array_equal(round_logits[i], want)
