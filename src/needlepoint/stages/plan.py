"""Where a model is cut: contiguous ranges of blocks, one per stage.

`plan_stages(sizes, stages)` takes `stages` as a count N (balanced by `sizes`, the weight
bytes each block reads: `part.block_bytes()`; for Needle 3 its own records plus its rows of
the shared mHC records, for a transformer equal shares) or as the first block of every
stage (`[0, 7, 14]`: stage 0 holds blocks 0-6, stage 1 blocks 7-13, stage 2 the rest).
Block indices are those of the loaded model (a ladder rung's blocks are numbered 0..k-1, as
`needlepoint.load(path, layers=k)` numbers them).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import StagePlanError


@dataclass(frozen=True)
class StageRange:
    """Stage `index` holds blocks `first .. end-1` of the loaded model."""

    index: int
    first: int
    end: int
    weight_bytes: int  # bytes its blocks read (`sizes`)

    @property
    def layers(self) -> range:
        return range(self.first, self.end)

    def describe(self) -> str:
        span = f"layer {self.first}" if self.end - self.first == 1 else (
            f"layers {self.first}-{self.end - 1}")
        return f"stage {self.index} ({span})"


@dataclass(frozen=True)
class StagePlan:
    ranges: tuple[StageRange, ...]
    num_layers: int

    @property
    def cuts(self) -> tuple[int, ...]:
        return tuple(r.first for r in self.ranges)

    def __len__(self) -> int:
        return len(self.ranges)


def balanced_cuts(weights: Sequence[int], count: int) -> list[int]:
    """First index of each of `count` contiguous groups of `weights`, minimising the largest
    group's sum (ties: the earliest cuts), by dynamic programming over the prefix sums."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: the smallest possible largest sum splitting weights[:i] into k groups
    best = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    starts = []
    i = n
    for k in range(count, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def plan_stages(sizes: Sequence[int], stages: int | Sequence[int]) -> StagePlan:
    """The stage ranges for `stages` (a count, or each stage's first block) of blocks whose
    weights take `sizes` bytes; StagePlanError for a count outside 1..layers or cut points
    that are not 0, increasing, in range."""
    layers = len(sizes)
    if isinstance(stages, bool):
        raise StagePlanError(f"stages must be a count or a list of cut points, got {stages!r}")
    if isinstance(stages, numbers.Integral):
        stages = int(stages)
        if not 1 <= stages <= layers:
            raise StagePlanError(
                f"stages={stages}: the model has {layers} layers, so 1 to {layers} stages")
        cuts = balanced_cuts(sizes, stages)
    else:
        try:
            cuts = [int(c) for c in stages]
        except (TypeError, ValueError):
            raise StagePlanError(f"stages must be a count or a list of cut points (first layer "
                                 f"of each stage), got {stages!r}") from None
        if any(isinstance(c, bool) for c in stages) or not cuts:
            raise StagePlanError(f"stages: cut points must be layer indices, got {stages!r}")
        if cuts[0] != 0:
            raise StagePlanError(f"stages={cuts}: the first stage must start at layer 0")
        if any(b <= a for a, b in zip(cuts, cuts[1:], strict=False)):
            raise StagePlanError(f"stages={cuts}: cut points must be strictly increasing")
        if cuts[-1] >= layers:
            raise StagePlanError(f"stages={cuts}: layer {cuts[-1]} is past the last layer "
                                 f"({layers} layers: 0-{layers - 1})")
    ends = cuts[1:] + [layers]
    ranges = tuple(
        StageRange(k, first, end, sum(sizes[first:end]))
        for k, (first, end) in enumerate(zip(cuts, ends, strict=True))
    )
    return StagePlan(ranges, layers)
