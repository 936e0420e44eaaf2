"""A split model's own costs timed in the steady steps: its batch transform and recombination.

The profiler times both on their own at the end of the window (`transform_cost`,
`recombine_cost`): the fastest of a few calls, which is what lets any profile price a split
that no profile has run. In a split model's steps they can cost more than that (the transform
also copies the features it does not split, and the step's own data fills the caches). So where
the profiled plan has splits, the session also times each steady step's transform and
recombination as the step runs them, on CPU, through the timers the plan's `BatchTransform` and
`VirtualTables` call; the analysis scales the stand-alone fits by what the steps measured
(`analysis.split_cost_fit`).

A step's record: [transform seconds, split features, ids routed, recombination seconds
(forward and backward), pooled elements read, pooled elements written]; a step that ran no
transform or no recombination (the timers are set between steps) is not recorded.
"""

from __future__ import annotations

from typing import Any

from torch import nn

SPLIT_COST_FIELDS = ("transform_s", "features", "ids", "recombine_s", "read", "written")


def virtual_tables(model: nn.Module) -> list[Any]:
    """The split model's `VirtualTables` modules in `model` (none for a model without splits)."""
    from sparselift.plans.rewrite import VirtualTables

    return [m for m in model.modules() if isinstance(m, VirtualTables)]


class SplitCostTimer:
    """Sums each step's transform and recombination seconds while attached.

    Args:
        transform: the plan's `BatchTransform`, the one the data path calls.
        modules: the model's `VirtualTables` (`virtual_tables`).
    """

    def __init__(self, transform: Any, modules: list[Any]) -> None:
        self.transform, self.modules = transform, modules
        self._step: list[float] = [0.0] * len(SPLIT_COST_FIELDS)
        self._seen = [False, False]  # a transform, a recombination forward this step

    @property
    def usable(self) -> bool:
        """Whether there is a split model to time."""
        return self.transform is not None and bool(self.modules)

    def attach(self) -> None:
        """Set the timers."""
        self.transform.timer = self._on_transform
        for m in self.modules:
            m.timer = self._on_recombine

    def detach(self) -> None:
        """Unset the timers (a step's backward still reports to this timer)."""
        self.transform.timer = None
        for m in self.modules:
            m.timer = None

    def begin(self) -> None:
        """A step starts: its sums start at 0."""
        self._step = [0.0] * len(SPLIT_COST_FIELDS)
        self._seen = [False, False]

    def end(self) -> list[float] | None:
        """The step begun last has ended: its record, or None if it ran no transform or no
        recombination."""
        return list(self._step) if all(self._seen) else None

    def _on_transform(self, seconds: float, features: int, ids: int) -> None:
        self._seen[0] = True
        self._step[0] += seconds
        self._step[1] += features
        self._step[2] += ids

    def _on_recombine(self, phase: str, seconds: float, read: int, written: int) -> None:
        self._step[3] += seconds
        if phase == "forward":
            self._seen[1] = True
            self._step[4] += read
            self._step[5] += written


def split_cost_record(per_rank: list[list[list[float]] | None]) -> list[Any] | None:
    """The manifest's `split_cost_s`: per rank its steady steps' records (`SPLIT_COST_FIELDS`);
    None where no rank timed any."""
    if not any(per_rank):
        return None
    return [r or [] for r in per_rank]
