"""`Needle.complete_many(queries)`: many independent first turns, decoded together.

Every query is checked and planned up front, on the caller's thread (prompt, grammar,
options: a bad query or option raises before any model work, as `complete` would). Then
each query runs its turn on a thread of its own over a session of one `Scheduler`
(`scheduler.py`), whose engine thread batches the work of all of them into one model call
per step. The envelopes come back in the order of the queries; each is the envelope
`complete(query)` returns (in deploy numerics the same logits bits, so the same answer; a
`seed=None` turn draws its own seed, reported in its envelope).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import InvalidQueryError
from .conversation import Conversation
from .results import annotated, final
from .scheduler import Scheduler

DEFAULT_SESSIONS = 16


def complete_many(
    needle: Any,
    queries: Iterable[str],
    *,
    max_sessions: int = DEFAULT_SESSIONS,
    scheduler: Scheduler | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """The envelopes of `needle.complete(q, **options)` for every query, in order, at most
    `max_sessions` decoding at once as one batch (or through `scheduler`, shared with other
    callers, e.g. a server's). The needle's own conversation is left alone."""
    if isinstance(queries, str):
        raise InvalidQueryError("complete_many takes a list of queries; use complete() "
                                "for a single one")
    prepared = [_prepare(needle, query, options) for query in queries]
    if not prepared:
        return []
    own = scheduler is None
    if scheduler is None:
        scheduler = Scheduler(needle.model, max_sessions=max_sessions)
    elif scheduler.model is not needle.model:
        raise ValueError("the scheduler serves another model than this Needle's")

    def one(index: int) -> dict[str, Any]:
        ids, plan = prepared[index]
        with scheduler.lease(wait=True) as lease:
            conversation = Conversation(lease.model, needle.planner.vocab,
                                        kv_window=needle.kv_window)
            events = conversation.turn(ids, plan.config, plan.grammar, content=plan.content,
                                       check_tools=plan.check_tools,
                                       parallel_calls=plan.parallel)
            return final(annotated(events, plan.notes))

    try:
        threads = min(len(prepared), scheduler.max_sessions)
        with ThreadPoolExecutor(threads, thread_name_prefix="needlepoint-request") as pool:
            futures = [pool.submit(one, index) for index in range(len(prepared))]
            return [future.result() for future in futures]
    finally:
        if own:
            scheduler.close()


def _prepare(needle: Any, query: Any, options: dict[str, Any]) -> tuple[list[int], Any]:
    """What `Needle.stream` computes before decoding: the prompt ids and the turn's plan."""
    ids = needle.prompt_ids(query)  # checks the query first (InvalidQueryError)
    return ids, needle.planner.plan(needle.offered_tools(query), options)
