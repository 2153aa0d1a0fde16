"""The in-process transport: every stage in this process, each on its own worker thread.

A call is queued on its stage's thread and returns a future; an argument that is a future
of another call is waited for by the worker, so a chain of calls (stage 0 -> 1 -> 2 of one
chunk) is submitted at once and the stages overlap across chunks, as Ray actors do with object
references: stage k works on chunk i while stage k-1 works on chunk i+1 (numpy and the native
kernels release the GIL in their products). Arrays are passed by reference, never copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .stage import Stage, StageSpec
from .transport import Transport


class LocalTransport(Transport):
    kind = "local"

    def __init__(self, specs: Sequence[StageSpec]) -> None:
        self.specs = list(specs)
        self.stages = [Stage(spec) for spec in self.specs]
        self.workers = [
            ThreadPoolExecutor(1, thread_name_prefix=f"needlepoint-stage{spec.index}")
            for spec in self.specs
        ]
        self.closed = False

    def submit(self, stage: int, method: str, *args: Any) -> Future:
        target = getattr(self.stages[stage], method)

        def job() -> Any:
            return target(*[a.result() if isinstance(a, Future) else a for a in args])

        return self.workers[stage].submit(job)

    def gather(self, pending: Sequence[Future], timeout: float | None = None) -> list[Any]:
        """Results in order; the first failure (in order) is raised as it was raised."""
        return [future.result() for future in pending]

    def fire(self, stage: int, method: str, *args: Any) -> None:
        """Queue a call whose result and errors nobody waits for (closing a session)."""
        if self.closed:
            return
        try:
            self.submit(stage, method, *args)
        except RuntimeError:  # the worker has shut down
            pass

    def restart(self, stage: int) -> None:
        """A fresh stage in place of `stage` (its sessions' caches are gone), as Ray's
        restart of a lost actor gives (recovery.py)."""
        self.stages[stage] = Stage(self.specs[stage])

    def wait_back(self, stage: int, timeout: float) -> str:
        """The stage's incarnation once it answers (here it always does)."""
        return self.call(stage, "ping")

    def close(self) -> None:
        self.closed = True
        for worker in self.workers:
            worker.shutdown(wait=True)
