"""What the two transports (`local.LocalTransport`, `ray_transport.RayTransport`) share:
calls to the stages by method name, over each one's own `submit` and `gather`."""

from __future__ import annotations

from typing import Any


class Transport:
    """`call` and `call_all` over `submit(stage, method, *args)` (a pending result) and
    `gather(pending)` (the results in order, the first failure raised), which each transport
    defines; `specs` are its stages."""

    specs: list[Any]

    def call(self, stage: int, method: str, *args: Any) -> Any:
        return self.gather([self.submit(stage, method, *args)])[0]

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return self.gather([self.submit(k, method, *args) for k in range(len(self.specs))])
