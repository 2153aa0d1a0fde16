"""One stage: a contiguous range of blocks and, per session, their caches.

A `Stage` runs wherever its transport puts it (a thread of this process, a Ray actor on
another machine). It opens the archive itself and prepares only its blocks (`StageModel`).
`run` takes one chunk of one session: the lanes from the previous stage (stage 0: the scaled
embeddings x0, from which it builds the lanes as the single-process pass does), and the key and
tapped value of each engram site among its blocks (computed by the head); it runs
`block.run_block` for each of its blocks, folds the lane means into the session's confidence
pool rows, and returns the lanes (the last stage: the lane means of the rows the head reads
out). Activations are refused at both ends of the hop if any value is not finite.
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
    StagePlanError,
    StageSessionLostError,
)
from ..formats.cact import open_archive
from ..models.loader import resolve_threads
from ..models.needle3.attention import ChunkFrame
from ..models.needle3.block import cell_row, run_block
from ..models.needle3.cache import LayerCache
from ..models.needle3.exact_attention import Int8LayerCache
from ..models.needle3.heads import ConfidencePool
from ..models.needle3.session import bounded_window
from .memory import archive_resident_bytes, rss_bytes
from .parts import StageModel

F32 = np.float32


@dataclass(frozen=True)
class StageSpec:
    """Everything a stage needs to come up on its own (picklable: sent to Ray actors)."""

    path: str
    index: int
    count: int  # stages in the plan
    first: int
    end: int
    layers: int | None = None  # ladder rung depth (None: every block)
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
    def __init__(self, caches: dict, pool: ConfidencePool | None) -> None:
        self.caches = caches  # block index -> its cache
        self.pool = pool
        self.position = 0
        self.broken: str | None = None


class Stage:
    """Blocks `spec.first .. spec.end-1` and the caches of every open session."""

    def __init__(self, spec: StageSpec) -> None:
        self.spec = spec
        self.started = time.time()
        self.incarnation = uuid.uuid4().hex
        resolve_threads(spec.threads)
        archive = open_archive(spec.path)
        if archive.generation != 3:
            raise StagePlanError(f"{spec.path}: a Needle {archive.generation} archive; only "
                                 "Needle 3 models can be cut into stages")
        self.model = StageModel.load(archive, layers=spec.layers, first=spec.first,
                                     end=spec.end, numerics=spec.numerics,
                                     threads=spec.threads, cache=spec.cache)
        self.sessions: dict[str, _Session] = {}

    # -- sessions ---------------------------------------------------------------------------
    def open(self, sid: str, kv_window: int | None) -> str:
        model = self.model
        cfg = model.config
        conv_rows = max(0, cfg.qkv_conv_taps - 1)
        conv_width = (cfg.num_heads + cfg.num_kv_heads) * cfg.qk_head_dim
        conv_width += cfg.num_kv_heads * cfg.v_head_dim
        cache_type = Int8LayerCache if model.quantized else LayerCache
        caches = {
            index: cache_type(
                bounded_window(model.weights.layers[index].window, kv_window),
                cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim, conv_rows, conv_width,
                cfg.max_seq_len,
            )
            for index in range(self.spec.first, self.spec.end)
        }
        head = model.weights.confidence
        pool = ConfidencePool.empty(head) if head is not None else None
        self.sessions[sid] = _Session(caches, pool)
        return self.incarnation

    def fork(self, sid: str, new_sid: str) -> str:
        source = self._session(sid)
        other = _Session({i: c.copy() for i, c in source.caches.items()},
                         source.pool.copy() if source.pool is not None else None)
        other.position = source.position
        self.sessions[new_sid] = other
        return self.incarnation

    def close(self, sid: str) -> None:
        self.sessions.pop(sid, None)

    def pool_rows(self, sid: str):
        """(peak, total, pooled) of this stage's confidence rows (cells first+1 .. end)."""
        pool = self._session(sid).pool
        if pool is None:
            return None
        rows = slice(self.spec.first + 1, self.spec.end + 1)
        return pool.peak[rows].copy(), pool.total[rows].copy(), pool.pooled[rows].copy()

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
    def run(self, sid: str, start: int, x: np.ndarray, site_kv: dict, want: str | None):
        """Blocks of this stage for one chunk at positions `start ..`; `want` (last stage):
        "all" / "last" rows of lane means for the head's read-out, or "none"."""
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
        x = own_buffer(x)
        model = self.model
        quantized = model.quantized
        count = x.shape[0]
        lanes = np.repeat(x[:, None, :], model.config.mhc_lanes, axis=1) if spec.index == 0 \
            else x
        frame = ChunkFrame.build(model.step_plan, start, count)
        head = model.weights.confidence
        try:
            for index in range(spec.first, spec.end):
                layer = model.weights.layers[index]
                kv = None
                if layer.engram_site is not None:
                    pair = site_kv[layer.engram_site]
                    kv = (own_buffer(pair[0]), own_buffer(pair[1]))
                    if not (finite(kv[0]) and finite(kv[1])):
                        raise StageNonFiniteError(
                            f"{spec.name} received non-finite engram keys/values for layer "
                            f"{index} from the head (chunk at position {start})", spec.index)
                parts = [(slice(None), session.caches[index], frame)]
                try:
                    lanes = run_block(model, index, lanes, parts, kv)
                except NonFiniteActivationError as error:
                    if isinstance(error, StageError):
                        raise
                    raise StageNonFiniteError(f"{spec.name}: layer {index}: {error}",
                                              spec.index) from None
                if session.pool is not None:
                    session.pool.update(head, cell_row(lanes, quantized)[:, None, :],
                                        index + 1)
        except BaseException as error:
            session.broken = f"{type(error).__name__} in {spec.name}"
            raise
        session.position = start + count
        if not finite(lanes):
            session.broken = "non-finite output"
            target = "the head" if spec.last else f"stage {spec.index + 1}"
            raise StageNonFiniteError(f"{spec.name} computed non-finite activations (chunk "
                                      f"at position {start}); not sent to {target}", spec.index)
        if not spec.last:
            return lanes
        if want == "none" or want is None:
            return None
        rows = lanes if want == "all" else lanes[-1:]
        return cell_row(rows, True) if quantized else rows.mean(axis=1)

    # -- reports ----------------------------------------------------------------------------
    def info(self) -> dict:
        spec = self.spec
        return {
            "stage": spec.index, "first": spec.first, "end": spec.end, "name": spec.name,
            "pid": os.getpid(), "host": socket.gethostname(), "incarnation": self.incarnation,
            "started": self.started, "sessions": len(self.sessions),
            "rss_bytes": rss_bytes(), "archive_resident_bytes": archive_resident_bytes(spec.path),
            "weight_bytes": self.model.weight_bytes,
        }

    def ping(self) -> str:
        return self.incarnation


def check_kv_window(kv_window: int | None) -> None:
    if kv_window is not None and kv_window <= 0:
        raise ModelInputError(f"kv_window must be positive, got {kv_window}")
