"""Chunks of several sequences in one pass (continuous batching; docs/numerics.md).

`run_batch(model, requests)` appends each request's ids to its own session, as
`session.prefill(ids)` / `session.extend(ids)` would, but runs one round of chunks at a time
through the batch forward (`forward.forward`), every session's next chunk an item: in deploy
numerics every block's products read the weights once for the rows of all sequences, and
each sequence attends its own cache; rows are row-wise exact and batch-invariant, so a
request's logits are the same bits alone or among others. Float numerics run each item on
its own (BLAS results depend on the number of rows).

A call whose tokens fit one pass (`PASS_ROWS`: a scheduler step, 256 rows by default, always
does) runs as one forward: each request's tokens one item, however many of its session's
prefill chunks they span, so prompt, draft and decode rows of every session share each
product's tiles in one pass over the weights. Longer calls run in rounds of each session's
own chunks. Deploy rows are chunk-invariant, so the bits are the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..chunking import chunks
from .forward import forward, joined
from .protocol import BlockModel
from .session import V3Session

# Rows of one stacked pass: above a scheduler step's budget (api/scheduler.py, 256), small
# enough that the native step's scratch (~tens of KB a row) stays a few MB.
PASS_ROWS = 512


def run_batch(
    model: BlockModel, requests: Sequence[tuple[V3Session, Sequence[int] | np.ndarray, bool]]
) -> list[np.ndarray]:
    """Per request (session, ids, all_logits): logits [len(ids), vocab] if all_logits else the
    last row [vocab], after appending ids to that session. Sessions must be distinct."""
    sessions = [session for session, _, _ in requests]
    if len({id(s) for s in sessions}) != len(sessions):
        raise ValueError("run_batch: each session may appear once per call")
    tokens = [session.model.check_ids(ids, session.position) for session, ids, _ in requests]
    for session in sessions:
        if session.model is not model:
            raise ValueError("run_batch: every session must belong to this model")
    if not model.num.stacks:  # float numerics: each request on its own, as a session runs it
        return [session.extend(ids) if every else session.prefill(ids)
                for (session, _, every), ids in zip(requests, tokens, strict=True)]
    one_pass = sum(len(ids) for ids in tokens) <= PASS_ROWS
    plans = [list(chunks(len(ids), max(1, len(ids)) if one_pass else session.chunk,
                         "all" if every else "last"))
             for (session, _, every), ids in zip(requests, tokens, strict=True)]
    outputs: list[list[np.ndarray]] = [[] for _ in requests]
    for round_ in range(max((len(plan) for plan in plans), default=0)):
        members = [i for i, plan in enumerate(plans) if round_ < len(plan)]
        pieces = {i: tokens[i][plans[i][round_].first : plans[i][round_].end] for i in members}
        items = [sessions[i].item(pieces[i], plans[i][round_].rows) for i in members]
        for i, logits in zip(members, forward(model, items), strict=True):
            sessions[i].took(pieces[i])
            if logits is not None:
                outputs[i].append(logits)
    return [joined(parts) if every else joined(parts)[-1]
            for (_, _, every), parts in zip(requests, outputs, strict=True)]
