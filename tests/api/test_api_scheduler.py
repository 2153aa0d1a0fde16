"""Continuous batching (`needlepoint.api.scheduler`): a request's logits are the same bits
alone and among 16 others, on the tiny Needle 3 fixture and the toy model, through the
batched model call and through the one-by-one fallback; requests join and leave between
steps; prefills are chunked under the step budget; a cancelled request's session is freed
at the next step; the caps refuse; `Needle.complete_many` returns what `complete` does.

The logits compared are the ones the scheduler handed to the turn: each request's model
view wraps its sessions in a `Recorder` that keeps a copy of every array `prefill`/`step`
returned, and the same requests run again on plain sessions of the model (no scheduler).
"""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from api_helpers import EVAL
from conftest import get_fixture, toy_model_path

import needlepoint
from needlepoint.api.scheduler import AdmissionFull, RequestCancelled, Scheduler, SchedulerFull
from needlepoint.generation.draft_policy import policy_for
from needlepoint.models.protocol import SessionCapabilities

EXAMPLES = [json.loads(line) for line in EVAL.read_text().splitlines()[:17]]
MAX_NEW = 12
ALONE: dict[str, list] = {}  # each model's lone runs of EXAMPLES


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {"toy": needlepoint.load(toy_model_path()),
            "tiny": needlepoint.load(get_fixture("needle3", "tiny").cact)}


class Recorder:
    """A session wrapper that keeps a copy of every logits array handed out."""

    def __init__(self, inner: Any, log: list[np.ndarray], on_step: Callable[[], None]) -> None:
        self.inner, self.log, self.on_step = inner, log, on_step

    @property
    def position(self) -> int:
        return self.inner.position

    @property
    def capabilities(self) -> SessionCapabilities:
        # fork and confidence_logit (the confidence head) only: without extend/rewind the
        # turn decodes one step at a time, alone as through the scheduler's proxies, so
        # every logits row it is handed is recorded
        inner = self.inner.capabilities
        return SessionCapabilities(fork=inner.fork, confidence=inner.confidence)

    def prefill(self, ids: Any, logits: bool = True) -> Any:
        out = self.inner.prefill(ids, logits=logits)
        if out is not None:
            self.log.append(np.array(out, copy=True))
        return out

    def step(self, token: int) -> np.ndarray:
        out = self.inner.step(token)
        self.log.append(np.array(out, copy=True))
        self.on_step()
        return out

    def __getattr__(self, name: str) -> Any:
        if name in ("fork", "confidence_logit"):
            return getattr(self.inner, name)
        raise AttributeError(name)


class RecordingModel:
    """A model (or a lease's model view) whose sessions are `Recorder`s."""

    def __init__(self, model: Any, on_step: Callable[[], None] = lambda: None) -> None:
        self.model, self.logs, self.on_step = model, [], on_step
        self.recorders: list[Recorder] = []

    def session(self, kv_window: int | None = None) -> Recorder:
        self.logs.append([])
        recorder = Recorder(self.model.session(kv_window=kv_window), self.logs[-1], self.on_step)
        self.recorders.append(recorder)
        return recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def run_alone(model: Any, example: dict[str, Any], **options: Any) -> tuple[dict, list]:
    view = RecordingModel(model)
    needle = needlepoint.Needle(tools=example["tools"], model=view, cache=None)
    envelope = needle.complete(example["query"], max_new_tokens=MAX_NEW, **options)
    return envelope, view.logs[0]


def run_together(scheduler: Scheduler, examples: list[dict[str, Any]], *,
                 start_after: int = 0, delay: dict[int, threading.Event] | None = None,
                 **options: Any) -> list[tuple[dict, list]]:
    """Each example's turn on its own thread, through the scheduler. With `start_after`,
    the engine starts once that many requests are waiting (all in the first step);
    `delay[i]` holds request i back until the event is set (a join between steps)."""
    results: list[Any] = [None] * len(examples)

    def one(i: int) -> None:
        if delay and i in delay:
            assert delay[i].wait(120)
        try:
            with scheduler.lease(wait=True) as lease:
                view = RecordingModel(lease.model)
                needle = needlepoint.Needle(tools=examples[i]["tools"], model=view, cache=None)
                envelope = needle.complete(examples[i]["query"], max_new_tokens=MAX_NEW,
                                           **options)
                results[i] = (envelope, view.logs[0])
        except BaseException as error:  # noqa: BLE001 - re-raised by the test thread
            results[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(examples))]
    for thread in threads:
        thread.start()
    if start_after:
        wait_for(lambda: scheduler.stats()["pending"] >= start_after)
        scheduler.start()
    for thread in threads:
        thread.join(300)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def wait_for(condition: Callable[[], bool], limit: float = 120.0) -> None:
    """Poll `condition` (a guard against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b, strict=True))


def assert_same(alone: list[tuple[dict, list]], together: list[tuple[dict, list]]) -> None:
    for (env_a, logits_a), (env_b, logits_b) in zip(alone, together, strict=True):
        assert len(logits_a) == env_a["timings"]["decode_tokens"]  # prefill + every step
        assert same_bits(logits_a, logits_b)
        for key in ("type", "function_calls", "text", "reasoning", "stop_reason"):
            assert env_a[key] == env_b[key]
        assert env_a["timings"]["decode_tokens"] == env_b["timings"]["decode_tokens"]


@pytest.mark.parametrize("batched", [True, False], ids=["run_batch", "one_by_one"])
@pytest.mark.parametrize("name", ["toy", "tiny"])
def test_logits_bit_identical_alone_and_among_16(models: dict[str, Any], name: str,
                                                 batched: bool) -> None:
    model = models[name]
    assert hasattr(model, "run_batch")  # Needle 3 models batch sessions in one pass
    if name not in ALONE:  # shared by both paths
        ALONE[name] = [run_alone(model, e) for e in EXAMPLES]
    alone = ALONE[name]
    # Every prefill in the first step (budget for all 17 prompts), then a barrier-like
    # gather: every step carries every live request.
    scheduler = Scheduler(model, max_sessions=17, batched=batched, step_tokens=8192,
                          autostart=False, gather_s=30, max_gather_s=30, log_steps=True)
    try:
        together = run_together(scheduler, EXAMPLES, start_after=len(EXAMPLES))
    finally:
        scheduler.close()
    assert_same(alone, together)
    log = scheduler.step_log
    assert sorted(number for number, _ in log[0]) == list(range(1, 18))  # 17 prefills
    assert all(rows > 1 for _, rows in log[0])
    stepping = sum(1 for envelope, _ in alone if envelope["timings"]["decode_tokens"] > 1)
    assert len(log[1]) == stepping and all(rows == 1 for _, rows in log[1])  # all decode
    assert scheduler.stats()["max_batch"] == 17 and scheduler.stats()["live_sessions"] == 0


def test_join_and_leave_between_steps_with_chunked_prefill(models: dict[str, Any]) -> None:
    """Four requests decode; four more join while they do (their prompts cut into chunks
    under a small step budget, beside the decode steps); each request leaves when done."""
    model = models["tiny"]
    examples = EXAMPLES[:8]
    alone = [run_alone(model, e) for e in examples]
    scheduler = Scheduler(model, max_sessions=8, step_tokens=64, log_steps=True)
    joins = {i: threading.Event() for i in range(4, 8)}
    # the joiners are let in once the first four have decoded a few tokens
    watcher = threading.Thread(target=lambda: (
        wait_for(lambda: scheduler.stats()["steps"] >= 8), [e.set() for e in joins.values()]))
    watcher.start()
    try:
        together = run_together(scheduler, examples, delay=joins)
    finally:
        watcher.join(60)
        scheduler.close()
    assert_same(alone, together)
    log = scheduler.step_log
    assert all(n <= 4 for step in log[:8] for n, _ in step)  # the joiners came later
    mixed = [step for step in log if any(r == 1 for _, r in step) and any(r > 1 for _, r in step)]
    assert mixed, "no step ran a prefill chunk beside decode steps"
    chunks: dict[int, list[int]] = {}
    for step in log:
        for number, rows in step:
            if rows > 1:
                chunks.setdefault(number, []).append(rows)
    assert any(len(c) > 1 for c in chunks.values()), "no prompt was cut into chunks"
    for c in chunks.values():
        assert all(rows % 128 == 0 for rows in c[:-1])  # cut where the session cuts alone
    assert scheduler.stats()["live_sessions"] == 0


def test_cancel_frees_the_session_at_the_next_step(models: dict[str, Any]) -> None:
    model = models["toy"]
    scheduler = Scheduler(model, max_sessions=1)
    stepped = threading.Event()
    outcome: dict[str, Any] = {}
    lease = scheduler.lease()

    def run() -> None:
        counter = iter(range(10**6))
        view = RecordingModel(lease.model, on_step=lambda: next(counter) == 3 and stepped.set())
        outcome["view"] = view
        needle = needlepoint.Needle(tools=[], model=view, cache=None)
        try:
            needle.complete("hello", allow_call=False, max_new_tokens=400)
        except RequestCancelled as error:
            outcome["error"] = type(error)  # not the error: its traceback holds the session

    thread = threading.Thread(target=run)
    try:
        thread.start()
        assert stepped.wait(60)
        session = weakref.ref(outcome.pop("view").recorders[0].inner.session)
        with pytest.raises(AdmissionFull):
            scheduler.lease()  # one session at most
        lease.cancel()
        assert scheduler.stats()["live_sessions"] == 0  # the slot is free at once
        thread.join(60)
        assert outcome.get("error") is RequestCancelled
        gc.collect()
        assert session() is None  # nothing holds the cancelled request's KV cache
        with scheduler.lease() as again:  # and a new request gets it
            session = again.model.session()
            assert session.prefill([1, 2, 3]).shape == (model.config.vocab,)
        stats = scheduler.stats()
        assert stats["cancelled"] == 1 and stats["live_sessions"] == 0
        assert stats["refused"] == 1
    finally:
        scheduler.close()
    with pytest.raises(RequestCancelled):  # the cancelled lease runs nothing more
        lease.model.session()


def test_caps_on_sessions_and_kv_bytes(models: dict[str, Any]) -> None:
    model = models["toy"]
    scheduler = Scheduler(model, max_sessions=2)
    try:
        first, second = scheduler.lease(), scheduler.lease()
        with pytest.raises(AdmissionFull, match="2 of 2 sessions"):
            scheduler.lease()
        with pytest.raises(AdmissionFull):
            scheduler.lease(wait=True, timeout=0.01)
        second.close()
        third = scheduler.lease()
        first.close(), third.close()
    finally:
        scheduler.close()
    per = scheduler.session_kv_bytes
    assert per > 0
    kv = Scheduler(model, max_sessions=8, max_kv_bytes=per + per // 2)
    try:
        with kv.lease():
            with pytest.raises(AdmissionFull, match="KV bytes"):
                kv.lease()
        with kv.lease():
            assert kv.stats()["kv_bytes_reserved"] == per
    finally:
        kv.close()
    with pytest.raises(AdmissionFull, match="over the cap"):
        Scheduler(model, max_kv_bytes=per - 1).lease()
    assert SchedulerFull is AdmissionFull  # the former name, kept for callers


def test_complete_many_matches_complete(models: dict[str, Any]) -> None:
    model = models["tiny"]
    tools = EXAMPLES[0]["tools"]
    needle = needlepoint.Needle(tools=tools, model=model, cache=None)
    queries = [e["query"] for e in EXAMPLES[:6]]
    one_by_one = [needle.complete(q, max_new_tokens=MAX_NEW) for q in queries]
    together = needle.complete_many(queries, max_new_tokens=MAX_NEW, max_sessions=4)
    for a, b in zip(one_by_one, together, strict=True):
        for key in ("type", "function_calls", "text", "reasoning", "stop_reason"):
            assert a[key] == b[key]
        assert b["confidence"] == pytest.approx(a["confidence"], abs=1e-5)  # the head pools
    assert needle.complete_many([]) == []
    with pytest.raises(needlepoint.errors.InvalidQueryError):
        needle.complete_many(["fine", "  "])  # checked before any model work
    with pytest.raises(needlepoint.errors.InvalidQueryError):
        needle.complete_many("one string")


def test_complete_many_on_a_model_without_run_batch() -> None:
    """Unbatched (`batched=False`, as for a model without `run_batch`): the scheduler runs
    each item alone, same answers (Needle 2's `run_batch` runs its sessions one by one)."""
    model = needlepoint.load(get_fixture("needle2", "tiny").cact)
    assert callable(model.run_batch)  # the model Protocol (models/protocol.py)
    needle = needlepoint.Needle(tools=EXAMPLES[0]["tools"][:1], model=model, cache=None)
    queries = [e["query"] for e in EXAMPLES[:4]]  # prompts within its 256 positions
    scheduler = Scheduler(model, max_sessions=4, batched=False)
    try:
        together = needle.complete_many(queries, max_new_tokens=12, scheduler=scheduler)
        assert scheduler.stats()["batched"] is False and scheduler.stats()["max_batch"] > 0
    finally:
        scheduler.close()
    for query, envelope in zip(queries, together, strict=True):
        alone = needle.complete(query, max_new_tokens=12)
        assert (alone["text"], alone["function_calls"]) == (envelope["text"],
                                                           envelope["function_calls"])


def test_extend_and_rewind_through_the_scheduler(models: dict[str, Any]) -> None:
    """A draft verified and partly undone: the same bits and positions as on a lone session
    (the rewind is applied by the engine thread before the session's next work)."""
    model = models["tiny"]
    prompt = list(range(5, 150))
    scheduler = Scheduler(model, max_sessions=1)
    outputs = []
    try:
        with scheduler.lease() as lease:
            for session in (model.session(), lease.model.session()):
                got = [session.prefill(prompt), session.extend([5, 6, 7, 8])]
                session.rewind(3)
                got.append(np.array([session.position]))
                got += [session.step(9), session.extend([10, 11])]
                got.append(np.array([session.position]))
                assert session.chunk == 128
                outputs.append(got)
            proxy = lease.model.session()
            assert outputs[1] and proxy.capabilities.exact is True  # as the model's
            assert not hasattr(proxy, "exact_extend")  # exact numerics have one name
    finally:
        scheduler.close()
    assert same_bits(*outputs)
    assert int(outputs[1][2][0]) == len(prompt) + 1


def test_speculative_turns_through_the_scheduler(models: dict[str, Any]) -> None:
    """Turns that verify drafts (the default) get the tokens they get alone; the drafts are
    multi-row items of the engine steps, beside other requests' work."""
    model = models["toy"]
    needle = needlepoint.Needle(tools=EXAMPLES[0]["tools"], model=model, cache=None)
    queries = [e["query"] for e in EXAMPLES[:8]]
    alone = [needle.complete(q, max_new_tokens=32) for q in queries]
    scheduler = Scheduler(model, max_sessions=8, log_steps=True)
    policy = policy_for(model)
    reports: list[tuple[int, int]] = []
    policy.batched = lambda sessions, rows: reports.append((sessions, rows))  # type: ignore
    try:
        together = needle.complete_many(queries, max_new_tokens=32, scheduler=scheduler)
    finally:
        scheduler.close()
        del policy.batched
    # every decoding step told the draft policy its decoders and rows (draft_policy.py)
    assert any(sessions > 1 for sessions, _ in reports)
    assert all(1 <= sessions <= rows for sessions, rows in reports)
    for a, b in zip(alone, together, strict=True):
        for key in ("type", "function_calls", "text", "stop_reason"):
            assert a[key] == b[key]
        assert a["timings"]["decode_tokens"] == b["timings"]["decode_tokens"]
    passes = sum(e["timings"]["decode_passes"] for e in together)
    assert passes < sum(e["timings"]["decode_tokens"] for e in together)  # drafts accepted
    drafts = [step for step in scheduler.step_log if any(1 < rows <= 128 for _, rows in step)
              and len(step) > 1]
    assert drafts, "no step verified a draft beside other requests' work"
