"""Pipelining across requests: `run_batch` of a staged model in micro-batches.

The requests of one call (the scheduler's engine step: every live request's next token or
prefill chunk) are split into micro-batches (`micro_batches`; by default one per request
where a stage runs its chunks one by one anyway, and 2K for K stages where a stage stacks a
micro-batch into one pass: fewer, larger micro-batches share each weight read, more of them
shorten the pipeline's fill and drain, which costs K-1 of M + K-1 slots per call).
Each micro-batch round is one `run_many` call per stage, and every call is submitted before
the head waits for any, so stage k works on micro-batch m while stage k+1 works on m-1: the
stages are busy at once instead of K-1 of them waiting. A stage runs its micro-batch as one
stacked pass where the family can (Needle 3 deploy numerics: each block reads its weights
once for all rows) and chunk by chunk otherwise; in exact numerics every request's logits
are the same bits as alone (batch invariance, docs/numerics.md). Requests whose prompts span
several chunks take one round per chunk, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import StageNonFiniteError
from ..models.layer_range import chunks
from .head import embed_chunk
from .interface import StagedModelView
from .session import StagedSession
from .stage import finite


def groups(count: int, parts: int) -> list[range]:
    """`count` items cut into at most `parts` contiguous groups of near-equal size."""
    parts = max(1, min(parts, count))
    size, extra = divmod(count, parts)
    out, at = [], 0
    for k in range(parts):
        end = at + size + (1 if k < extra else 0)
        out.append(range(at, end))
        at = end
    return out


def _chunks(session: StagedSession, tokens: np.ndarray, every: bool) -> tuple[np.ndarray, list]:
    """The head's work for each chunk of one request: (start, Embedded, rows wanted)."""
    part = session.model.part
    start, out = session.position, []
    for piece in chunks(len(tokens), session.chunk, "all" if every else "last"):
        chunk = tokens[piece.first : piece.end]
        out.append((start, embed_chunk(part, session.head, chunk, start), piece.rows))
        start += len(chunk)
    return tokens, out


def default_micro_batches(model: StagedModelView, requests: int) -> int:
    """One per request, or 2 per stage where the stages stack a micro-batch in one pass."""
    if model.part.stacks:
        return min(requests, 2 * len(model.plan))
    return requests


def run_batch(model: StagedModelView, requests: Sequence[tuple[StagedSession, Any, bool]],
              micro_batches: int | None = None) -> list[np.ndarray]:
    """Per request (session, ids, all_logits): its logits ([len(ids), vocab] if all_logits,
    else the last row), the stages pipelined over `micro_batches` micro-batches (None:
    `default_micro_batches`)."""
    sessions = [session for session, _, _ in requests]
    if len({id(s) for s in sessions}) != len(sessions):
        raise ValueError("run_batch: each session may appear once per call")
    if not requests:
        return []
    # every request's ids are checked before any head state moves: bad input breaks nothing
    tokens = [session.model.part.check_ids(ids, session.position)
              for session, ids, _ in requests]
    for session in sessions:
        if session.model is not model:
            raise ValueError("run_batch: every session must belong to this model")
        session.check_usable()
    transport, ranges = model.transport, model.plan.ranges
    last = len(ranges) - 1
    try:
        work = [_chunks(session, ids, every)
                for (session, _, every), ids in zip(requests, tokens, strict=True)]
        pending = []  # (micro-batch request indices, the last stage's future)
        rounds = max(len(chunks) for _, chunks in work)
        for r in range(rounds):
            live = [i for i in range(len(requests)) if r < len(work[i][1])]
            parts = micro_batches or default_micro_batches(model, len(live))
            for group in groups(len(live), parts):
                members = [live[g] for g in group]
                chunks = [work[i][1][r] for i in members]
                sent: Any = [embedded.x for _, embedded, _ in chunks]
                for k, stage in enumerate(ranges):
                    items = [(sessions[i].sid, start,
                              {b: v for b, v in embedded.side.items()
                               if stage.first <= b < stage.end},
                              rows if k == last else None)
                             for i, (start, embedded, rows) in zip(members, chunks, strict=True)]
                    sent = transport.submit(k, "run_many", items, sent)
                pending.append((members, sent))
        outputs: list[list[np.ndarray]] = [[] for _ in requests]
        for members, future in pending:  # read out each micro-batch as it arrives, while
            results = transport.gather([future])[0]  # the stages work on the later ones
            for i, rows in zip(members, results, strict=True):
                if rows is None:
                    continue
                if not finite(rows):
                    raise StageNonFiniteError(f"the head received non-finite activations "
                                              f"from stage {last}")
                outputs[i].append(model.part.readout(np.asarray(rows)))
    except BaseException as error:
        for session in sessions:
            session._fail(error)
        raise
    results = []
    for (session, _, every), (tokens, _), parts in zip(requests, work, outputs, strict=True):
        session.tokens = np.concatenate([session.tokens, tokens])
        logits = np.concatenate(parts) if len(parts) > 1 else parts[0]
        results.append(logits if every else logits[-1])
    return results
