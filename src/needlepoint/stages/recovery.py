"""Replay on a lost stage (docs/distributed.md, "A stage lost mid-request").

Exact numerics (Needle 3 "deploy", transformer "int8") give the same bits on any machine and
for any chunking, so re-running a session's tokens through a fresh stage rebuilds its caches
bit for bit. The head keeps, per live session, everything that needs: the token ids consumed
so far (`StagedSession.tokens`); the rest (Needle 3's engram keys and values, the embedding
rows) is recomputed from them by a fresh `part.head_state()`.

When a call fails because a stage was lost (its process died: `StageLostError`; or it did
not answer within `call_timeout_s`: then it is killed so Ray restarts it), `Recovery.run`

1. waits for the stage to be back (Ray's restart of the actor, or a replacement where the
   actor is gone for good), at most `recovery_timeout_s`;
2. rebuilds every live session idle at that moment on the lost stage only: the stages before
   it run the tokens under a throw-away session id (their own caches stay untouched), the
   lost stage under the session's id;
3. rebuilds the sessions of the failed call on every stage (the surviving stages may have
   advanced part of the call, and the head's state too), with a fresh head state;
4. re-issues the failed call.

Bounded: more than `max_stage_recoveries` losses of one stage within `recovery_window_s`,
no stage back within `recovery_timeout_s`, or a call failing again after as many replays,
and the call fails with the typed error naming the stage, as without replay
(`max_stage_recoveries=0`: no replay at all).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import StageError, StageLostError, StageSessionLostError
from ..models.layer_range import chunks

T = TypeVar("T")


class SessionsMoved(Exception):  # noqa: N818 - a signal, not a failure
    """Sessions of a batch call moved to another replica (replicas.py regroups the call)."""


@dataclass(frozen=True)
class RecoveryPolicy:
    """How hard the head tries to survive a lost stage (`load_staged` options)."""

    max_stage_recoveries: int = 3  # losses of one stage replayed within the window
    recovery_window_s: float = 300.0
    recovery_timeout_s: float = 60.0  # for the stage to be back (restart or replacement)

    def __post_init__(self) -> None:
        if isinstance(self.max_stage_recoveries, bool) or self.max_stage_recoveries < 0:
            raise ValueError(f"max_stage_recoveries must be >= 0, got "
                             f"{self.max_stage_recoveries!r}")
        if self.recovery_window_s <= 0 or self.recovery_timeout_s <= 0:
            raise ValueError("recovery_window_s and recovery_timeout_s must be positive")


def recoverable(error: BaseException) -> int | None:
    """The stage whose loss `error` reports (a dead or silent stage, or a stage that has no
    cache of the session because it restarted), else None."""
    if isinstance(error, StageLostError) and error.stage is not None:
        return error.stage
    return None


class Recovery:
    """The head's record of live sessions and of stage losses, and the replay itself (one per
    staged model; thread-safe: the server's engine loops call at once)."""

    def __init__(self, model: Any, policy: RecoveryPolicy) -> None:
        self.model = model
        self.policy = policy
        self.sessions: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()  # one recovery at a time
        self._state = threading.Lock()  # the counters and the in-flight set
        self._in_flight: dict[str, int] = {}  # session id -> calls in flight on it
        self._losses: dict[int, deque] = {}  # stage -> monotonic times of its losses
        self.incarnations: dict[int, str] = {}  # stage -> incarnation last seen serving
        self.recovering: set[int] = set()
        self.losses = 0  # stage losses seen
        self.recoveries = 0  # losses survived (stage back, sessions replayed)
        self.replays = 0  # session replays
        self.replayed_tokens = 0
        self.failures = 0  # losses that failed their call (bound reached, stage not back)
        self.last_recovery_s: float | None = None
        self.group: Any = None  # the ReplicatedModel this replica belongs to (replicas.py)
        self.down: set[int] = set()  # replica mode: stages lost, not yet seen back

    # -- sessions ---------------------------------------------------------------------------
    def track(self, session: Any) -> None:
        self.sessions[session.sid] = session

    def forget(self, sid: str) -> None:
        self.sessions.pop(sid, None)

    # -- one call ---------------------------------------------------------------------------
    def run(self, sessions: Sequence[Any], call: Callable[[], T], regroup: bool = False) -> T:
        """`call()`, which uses `sessions`; on a lost stage, replay and call again (a call
        that reads `session.model` again; with `regroup`, a batch call bound to this
        replica, `SessionsMoved` when sessions moved to another replica)."""
        ids = [s.sid for s in sessions]
        attempts = 0
        with self._state:
            for sid in ids:
                self._in_flight[sid] = self._in_flight.get(sid, 0) + 1
        try:
            while True:
                with self._lock:  # a recovery under way finishes first (it may be
                    pass  # replaying these sessions, or moving them away)
                if regroup and any(s.model is not self.model for s in sessions):
                    raise SessionsMoved
                try:
                    return call()
                except StageError as error:
                    stage = recoverable(error)
                    if stage is None or attempts >= max(1, self.policy.max_stage_recoveries):
                        raise
                    attempts += 1
                    self._recover(stage, error, sessions)
                    if regroup and any(s.model is not self.model for s in sessions):
                        raise SessionsMoved from None
        finally:
            with self._state:
                for sid in ids:
                    left = self._in_flight.get(sid, 1) - 1
                    if left:
                        self._in_flight[sid] = left
                    else:
                        self._in_flight.pop(sid, None)

    def _recover(self, stage: int, error: StageError, failed: Sequence[Any]) -> None:
        """Bring `stage` back and replay; re-raises `error` (unchanged) if bounded out."""
        transport = self.model.transport
        if not self.policy.max_stage_recoveries:
            raise error
        with self._lock:
            started = time.monotonic()
            target = self.group.sibling_for(self.model) if self.group is not None else None
            if target is not None:  # replicas: move the sessions, no wait for a restart
                self._move_away(stage, error, failed, target)
                self.last_recovery_s = time.monotonic() - started
                return
            self.recovering.add(stage)
            try:
                known = self.incarnations.get(stage)
                if error.timed_out:
                    transport.restart(stage)  # silent, not dead: make Ray restart it
                try:
                    back = transport.wait_back(stage, self.policy.recovery_timeout_s)
                except StageError as gone:
                    self.failures += 1
                    raise type(error)(f"{error} (no replacement within "
                                      f"{self.policy.recovery_timeout_s:g} s: {gone})",
                                      stage) from None
                if back != known:  # a new incarnation: every idle session lost its cache
                    self._count_loss(stage, error)
                    self.incarnations[stage] = back
                    busy = {s.sid for s in failed}
                    with self._state:
                        busy |= set(self._in_flight)
                    idle = [(session, {stage}, False) for session in
                            list(self.sessions.values())
                            if session.sid not in busy and session.replayable()]
                    self.recoveries += 1  # once per loss (other calls replay their own)
                else:
                    idle = []
                every = set(range(len(self.model.plan)))
                self.replay_all(idle + [(session, every, True) for session in failed])
                self.last_recovery_s = time.monotonic() - started
            finally:
                self.recovering.discard(stage)

    def _move_away(self, stage: int, error: StageError, failed: Sequence[Any],
                   target: Any) -> None:
        """Replica mode: this replica's stage is lost; its idle sessions and those of the
        failed call are replayed on every stage of `target` (another replica) and go on
        there; Ray restarts the lost stage meanwhile (`refresh` sees it back)."""
        if self._new_loss(stage, error):
            self._count_loss(stage, error)
            self.down.add(stage)
            if error.timed_out:
                self.model.transport.restart(stage)
            busy = {s.sid for s in failed}
            with self._state:
                busy |= set(self._in_flight)
            for session in list(self.sessions.values()):
                if session.sid not in busy and session.replayable():
                    target.recovery.adopt(session)
            self.recoveries += 1
        for session in failed:
            if session.model is self.model:
                target.recovery.adopt(session)

    def _new_loss(self, stage: int, error: StageError) -> bool:
        """Replica mode: a loss not seen yet (a stage already down, or answering with the
        incarnation `refresh` saw come back, is not)."""
        if stage in self.down:
            return False
        if isinstance(error, StageSessionLostError):  # it answers: restarted since?
            try:
                back = self.model.transport.wait_back(stage, 1.0)
            except StageError:
                return True
            if back == self.incarnations.get(stage):
                return False
            self.incarnations[stage] = back
        return True

    def adopt(self, session: Any) -> None:
        """Take `session` over from another replica: its caches there are freed, it is
        replayed here on every stage from its tokens."""
        old = session.model
        session._finalizer.detach()
        old.recovery.forget(session.sid)
        for k in range(len(old.plan)):
            old.transport.fire(k, "close", session.sid)
        session.model = self.model
        session._register()
        self.replay(session, set(range(len(self.model.plan))))

    def refresh(self) -> None:
        """Replica mode: a lost stage answering again (Ray restarted it) is back in use."""
        for stage in sorted(self.down):
            try:
                back = self.model.transport.wait_back(stage, 0.05)
            except StageError:
                continue
            self.incarnations[stage] = back
            self.down.discard(stage)

    def _count_loss(self, stage: int, error: StageError) -> None:
        now = time.monotonic()
        seen = self._losses.setdefault(stage, deque())
        while seen and now - seen[0] > self.policy.recovery_window_s:
            seen.popleft()
        seen.append(now)
        self.losses += 1
        if len(seen) > self.policy.max_stage_recoveries:
            self.failures += 1
            raise type(error)(f"{error} ({len(seen)} losses of stage {stage} within "
                              f"{self.policy.recovery_window_s:g} s: max_stage_recoveries="
                              f"{self.policy.max_stage_recoveries} reached)", stage) from None

    # -- the replay -------------------------------------------------------------------------
    def replay(self, session: Any, dirty: set[int]) -> None:
        """Rebuild `session`'s caches on the stages in `dirty` from its tokens (`replay_all`)."""
        self.replay_all([(session, dirty, True)])

    def replay_all(self, items: Sequence[tuple[Any, set[int], bool]]) -> None:
        """Per (session, dirty stages, strict): rebuild the session's caches on the dirty
        stages from its tokens, in chunks: every stage up to the last dirty one runs them (a
        clean stage under a throw-away id, its own caches untouched); with every stage dirty
        the head's state is rebuilt too. Every session's chunks are submitted before any is
        waited for, so the stages replay several sessions at once (stage k the first while
        stage k-1 the next). A strict item's failure is raised; another's drops the session
        from its dirty stages, so its next call finds no cache there and replays it all."""
        transport = self.model.transport
        launched = [self._launch(session, dirty) for session, dirty, _ in items]
        problem: StageError | None = None
        for (session, dirty, strict), (names, head, checks) in zip(items, launched,
                                                                   strict=True):
            try:
                at = transport.gather(checks)
                if any(p != len(session.tokens) for p in at):
                    raise StageLostError(f"replaying session {session.sid[:8]} left the "
                                         f"stages at positions {at}, not "
                                         f"{len(session.tokens)}", max(dirty))
            except StageError as error:
                for k in dirty:
                    transport.fire(k, "close", session.sid)
                problem = problem or (error if strict else None)
                continue
            finally:
                for k, name in enumerate(names):
                    if name != session.sid:
                        transport.fire(k, "close", name)
            if len(dirty) == len(self.model.plan):
                session.head = head
            session.broken = None
            with self._state:
                self.replays += 1
                self.replayed_tokens += len(session.tokens)
        if problem is not None:
            raise problem

    def _launch(self, session: Any, dirty: set[int]) -> tuple[list[str], Any, list]:
        """Submit one session's replay: opens, chunks, then a `position` call per stage (a
        stage runs its calls in order: it answers once every chunk has run there)."""
        model, transport = self.model, self.model.transport
        part, ranges = model.part, model.plan.ranges
        reach = max(dirty) + 1
        names = [session.sid if k in dirty else f"{session.sid}-replay" for k in range(reach)]
        for k in range(reach):
            transport.submit(k, "open", names[k], session.kv_window)
        head, tokens = part.head_state(), session.tokens
        for piece in chunks(len(tokens), session.chunk, "none"):
            embedded = part.embed(head, tokens[piece.first:piece.end], piece.first)
            sent: Any = embedded.x
            for k in range(reach):
                stage = ranges[k]
                side = {b: v for b, v in embedded.side.items() if stage.first <= b < stage.end}
                last = "none" if k == len(ranges) - 1 else None
                sent = transport.submit(k, "run", names[k], piece.first, sent, side, last)
        return names, head, [transport.submit(k, "position", names[k]) for k in range(reach)]

    # -- reports ----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """For the server's /health and /metrics: "degraded" while a stage recovers."""
        recovering = sorted(self.recovering | self.down)
        return {"status": "degraded" if recovering else "ok", "recovering": recovering,
                "losses": self.losses, "recoveries": self.recoveries,
                "replays": self.replays, "replayed_tokens": self.replayed_tokens,
                "failures": self.failures, "live_sessions": len(self.sessions),
                "last_recovery_s": self.last_recovery_s}
