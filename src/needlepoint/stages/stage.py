"""One stage: a contiguous range of blocks and, per session, their caches.

A `Stage` runs wherever its transport puts it (a thread of this process, a Ray actor on
another machine). It opens the model file itself and prepares only its blocks
(`models.parts.load_part`: a `LayerRange` of any family). `run` takes one chunk of one
session: the previous stage's output (stage 0: the head's embedding rows) and the side inputs
of its blocks (Needle 3: the engram sites' keys and tapped values, computed by the head); it
runs `part.run_layers` over its blocks with the session's caches and returns the output
(the last stage: the rows the head reads out, `part.final_rows`). Activations are refused at
both ends of the hop if any value is not finite. `rewind` undoes positions exactly (exact
numerics), so speculative decoding runs across stages.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from dataclasses import dataclass

import numpy as np

from ..errors import (
    ModelInputError,
    NonFiniteActivationError,
    StageError,
    StageNonFiniteError,
    StageSessionLostError,
)
from ..models.loader import resolve_threads
from ..models.parts import load_part
from .memory import archive_resident_bytes, rss_bytes

F32 = np.float32


@dataclass(frozen=True)
class StageSpec:
    """Everything a stage needs to come up on its own (picklable: sent to Ray actors)."""

    path: str  # a Needle 3 archive, a Hugging Face model directory or a GGUF file
    index: int
    count: int  # stages in the plan
    first: int
    end: int
    layers: int | None = None  # ladder rung depth / first blocks (None: every block)
    numerics: str = "deploy"
    threads: int = 1
    cache: bool | None = None

    @property
    def name(self) -> str:
        span = f"layer {self.first}" if self.end - self.first == 1 else (
            f"layers {self.first}-{self.end - 1}")
        return f"stage {self.index} ({span})"

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


def finite(x: np.ndarray) -> bool:
    """Every value finite (one float64 pass: NaN and inf propagate; no float32 overflow)."""
    return x.size == 0 or math.isfinite(float(np.add.reduce(x, axis=None, dtype=np.float64)))


def own_buffer(x: np.ndarray) -> np.ndarray:
    """`x` as a writeable float32 array (Ray's zero-copy arrays arrive read-only)."""
    if x.dtype != F32 or not x.flags.writeable or not x.flags.c_contiguous:
        return np.array(x, dtype=F32, order="C")
    return x


class _Session:
    def __init__(self, state) -> None:
        self.state = state  # the part's range state: its blocks' caches (and pool rows)
        self.position = 0
        self.broken: str | None = None


class Stage:
    """Blocks `spec.first .. spec.end-1` and the caches of every open session."""

    def __init__(self, spec: StageSpec) -> None:
        self.spec = spec
        self.started = time.time()
        self.incarnation = uuid.uuid4().hex
        resolve_threads(spec.threads)
        self.part = load_part(spec.path, blocks=(spec.first, spec.end), layers=spec.layers,
                              numerics=spec.numerics, threads=spec.threads, cache=spec.cache)
        self.sessions: dict[str, _Session] = {}

    # -- sessions ---------------------------------------------------------------------------
    def open(self, sid: str, kv_window: int | None) -> str:
        self.sessions[sid] = _Session(self.part.range_state(kv_window))
        return self.incarnation

    def fork(self, sid: str, new_sid: str) -> str:
        source = self._session(sid)
        other = _Session(source.state.copy())
        other.position = source.position
        self.sessions[new_sid] = other
        return self.incarnation

    def rewind(self, sid: str, position: int) -> None:
        """Undo positions >= `position` of a session (exact numerics)."""
        session = self._session(sid)
        if not 0 <= position <= session.position:
            raise StageError(f"{self.spec.name}: session {sid[:8]} is at position "
                             f"{session.position}, cannot rewind to {position}",
                             self.spec.index)
        session.state.rewind_to(position)
        session.position = position

    def close(self, sid: str) -> None:
        self.sessions.pop(sid, None)

    def position(self, sid: str) -> int:
        """Positions the session has consumed here (a replay's check: recovery.py)."""
        return self._session(sid).position

    def pool_rows(self, sid: str):
        """(peak, total, pooled) of this stage's confidence rows (None without the head)."""
        return self.part.confidence_rows(self._session(sid).state)

    def _session(self, sid: str) -> _Session:
        session = self.sessions.get(sid)
        if session is None:
            raise StageSessionLostError(
                f"{self.spec.name}: session {sid[:8]} has no cache here: the stage has "
                f"restarted since the session was opened (its cache is gone) or the session "
                f"was closed; start a new session", self.spec.index)
        if session.broken:
            raise StageSessionLostError(f"{self.spec.name}: session {sid[:8]} cannot continue "
                                        f"after an earlier failure ({session.broken})",
                                        self.spec.index)
        return session

    # -- one chunk --------------------------------------------------------------------------
    def run(self, sid: str, start: int, x: np.ndarray, side: dict, want: str | None):
        """Blocks of this stage for one chunk at positions `start ..`; `want` (last stage):
        "all" / "last" rows for the head's read-out, or "none"."""
        return self.run_many([(sid, start, side, want)], [x])[0]

    def run_many(self, items: list, xs: list) -> list:
        """A micro-batch: one chunk of each of several sessions, `items` = (sid, start,
        side, want) and `xs` their inputs (the previous stage's `run_many` result, passed
        whole so a Ray object reference resolves); one output each, as `run` gives."""
        spec = self.spec
        sessions, inputs, sides = [], [], []
        for (sid, start, side, _), x in zip(items, xs, strict=True):
            session, x, side = self._accept(sid, start, x, side)
            sessions.append(session)
            inputs.append(x)
            sides.append(side)
        starts = [start for _, start, _, _ in items]
        states = [session.state for session in sessions]
        try:
            if len(items) == 1:
                outs = [self.part.run_layers(spec.first, spec.end, inputs[0], states[0],
                                             starts[0], sides[0])]
            else:
                outs = self.part.run_layers_batch(spec.first, spec.end, inputs, states,
                                                  starts, sides)
        except BaseException as error:
            for session in sessions:
                session.broken = f"{type(error).__name__} in {spec.name}"
            if isinstance(error, NonFiniteActivationError) and not isinstance(error, StageError):
                raise StageNonFiniteError(f"{spec.name}: {error}", spec.index) from None
            raise
        return [self._emit(session, out, start, want)
                for session, out, (_, start, _, want) in zip(sessions, outs, items, strict=True)]

    def _accept(self, sid: str, start: int, x: np.ndarray, side: dict | None):
        spec = self.spec
        session = self._session(sid)
        if start != session.position:
            session.broken = "positions out of step"
            raise StageError(f"{spec.name}: session {sid[:8]} is at position "
                             f"{session.position}, got a chunk at {start}", spec.index)
        source = "the head" if spec.index == 0 else f"stage {spec.index - 1}"
        if not finite(x):
            session.broken = "non-finite input"
            raise StageNonFiniteError(f"{spec.name} received non-finite activations from "
                                      f"{source} (chunk at position {start})", spec.index)
        inputs = {}
        for block, arrays in (side or {}).items():
            inputs[block] = tuple(own_buffer(a) for a in arrays)
            if not all(finite(a) for a in inputs[block]):
                session.broken = "non-finite input"
                raise StageNonFiniteError(
                    f"{spec.name} received non-finite side inputs (engram keys/values) for "
                    f"layer {block} from the head (chunk at position {start})", spec.index)
        return session, own_buffer(x), inputs

    def _emit(self, session: _Session, out: np.ndarray, start: int, want: str | None):
        spec = self.spec
        session.position = start + out.shape[0]
        if not finite(out):
            session.broken = "non-finite output"
            target = "the head" if spec.last else f"stage {spec.index + 1}"
            raise StageNonFiniteError(f"{spec.name} computed non-finite activations (chunk "
                                      f"at position {start}); not sent to {target}", spec.index)
        if not spec.last:
            return out
        if want == "none" or want is None:
            return None
        return self.part.final_rows(out, want)

    # -- reports ----------------------------------------------------------------------------
    def info(self) -> dict:
        spec = self.spec
        return {
            "stage": spec.index, "first": spec.first, "end": spec.end, "name": spec.name,
            "pid": os.getpid(), "host": socket.gethostname(), "incarnation": self.incarnation,
            "started": self.started, "sessions": len(self.sessions),
            "rss_bytes": rss_bytes(), "archive_resident_bytes": archive_resident_bytes(spec.path),
            "weight_bytes": self.part.weight_bytes,
        }

    def ping(self) -> str:
        return self.incarnation


def check_kv_window(kv_window: int | None) -> None:
    if kv_window is not None and kv_window <= 0:
        raise ModelInputError(f"kv_window must be positive, got {kv_window}")
