"""The kernel weights a loaded model holds, found through the public API only (docs/api.md
"Public names for clients"): the product microbenchmarks load a model with
`needlepoint.load` and walk it for `needlepoint.kernels.ExactMatrix` / `I8Weight` objects
instead of rebuilding them with the models' internal loaders."""

from __future__ import annotations

from typing import Any

import numpy as np


def reachable(root: Any, kind: type) -> list[Any]:
    """Every `kind` object reachable from `root` (attributes, slots, sequences, dicts), each
    once, in the order first met."""
    found: list[Any] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, np.ndarray)):
            continue
        seen.add(id(obj))
        if isinstance(obj, kind):
            found.append(obj)
            continue
        if isinstance(obj, dict):
            items = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            items = list(obj)
        else:
            items = [getattr(obj, n, None) for n in getattr(type(obj), "__slots__", ())]
            items += list(getattr(obj, "__dict__", {}).values())
        stack.extend(reversed([item for item in items if item is not None and
                               type(item).__module__.startswith(("needlepoint", "builtins"))]))
    return found
