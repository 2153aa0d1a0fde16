"""Needle 3's layer-range interface (`models/layer_range.py`) as a client drives it: the
head's side inputs hold every engram site's key and value, and each part runs only its own
blocks' (the bench's per-piece profile hands the whole side to every stage)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import toy_model_path

import needlepoint
from needlepoint.models.parts import load_part


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_each_part_takes_the_whole_side_and_runs_only_its_blocks(cut):
    path = toy_model_path()
    head = load_part(path, head=True)
    blocks = head.config.num_layers
    parts = [load_part(path, blocks=(0, cut)), load_part(path, blocks=(cut, blocks))]
    state = head.head_state()
    states = [part.range_state() for part in parts]
    ids = np.arange(3, 40, dtype=np.int64)
    logits = []
    for start, chunk in ((0, ids[:30]), (30, ids[30:31]), (31, ids[31:])):
        embedded = head.embed(state, chunk, start)
        assert len(embedded.side) > 0  # the toy model has an engram site
        x = embedded.x
        for part, part_state in zip(parts, states, strict=True):
            x = part.run_layers(part.blocks.start, part.blocks.stop, x, part_state, start,
                                embedded.side)
        logits.append(head.readout(parts[-1].final_rows(x, "all")))
    expected = needlepoint.load(path).forward(ids)
    np.testing.assert_array_equal(np.concatenate(logits), expected)
