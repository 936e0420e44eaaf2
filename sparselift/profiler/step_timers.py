"""The session's per-step timers on CPU: the embedding kernels' own seconds and a split model's.

`ProfileSession` drives both through one object, step by step: the kernels' seconds from the
window's first step to the last steady step (`lookup_timer.py`), a split model's transform and
recombination in the steady steps only (`split_timer.py`). On other devices, or where there is
nothing to time, every call does nothing. Failures go through the session's guard: the timers
may never stop training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sparselift.profiler.gather import gather_to_rank0
from sparselift.profiler.lookup_timer import LookupTimer, kernel_modules, lookup_record
from sparselift.profiler.split_timer import SplitCostTimer, split_cost_record, virtual_tables

Guard = Callable[[Callable[[], Any], str], Any]  # runs a call, catching and listing its failure


class StepTimers:
    """The kernel and split timers of one rank's session.

    Args:
        modules: the sharded modules (`access.find_sharded_modules`).
        model: the DMP model (its `VirtualTables`, if it has splits).
        transform: the plan's `BatchTransform` that the data path calls, or None.
        device: the rank's device (timers run on CPU only).
        guard: the session's guard.
    """

    def __init__(
        self,
        modules: list[tuple[str, Any]],
        model: nn.Module,
        transform: Any,
        device: torch.device,
        guard: Guard,
    ) -> None:
        cpu = device.type == "cpu"
        self.guard = guard
        self.lookups = LookupTimer(kernel_modules(modules)) if cpu else None
        self.lookup_s: dict[str, list[list[float]]] = {"window": [], "steady": []}
        split = SplitCostTimer(transform, virtual_tables(model))
        self.split = split if cpu and split.usable else None
        self.split_s: list[list[float]] = []

    def _attached_lookups(self) -> LookupTimer | None:
        return self.lookups if self.lookups is not None and self.lookups.attached else None

    def open_window(self) -> None:
        """Set the kernel timer's hooks (at the window's first step)."""
        if self.lookups is not None:
            self.guard(self.lookups.attach, "timing the embedding kernels")

    def begin(self, steady: bool) -> None:
        """Before a window step or (`steady`) a steady step."""
        if (lookups := self._attached_lookups()) is not None:
            lookups.begin()
        if steady and self.split is not None:
            self.split.begin()

    def end(self, steady: bool) -> None:
        """After a window step or (`steady`) a steady step: record its seconds."""
        if (lookups := self._attached_lookups()) is not None:
            self.lookup_s["steady" if steady else "window"].append(lookups.end())
        if steady and self.split is not None:
            record = self.split.end()
            if record is not None:
                self.split_s.append(record)

    def start_steady(self) -> None:
        """Set the split model's timers (after the window, before the steady steps)."""
        if self.split is not None:
            self.guard(self.split.attach, "timing the split model's own costs")

    def detach(self) -> None:
        """Unset every hook and timer (no steady steps, or after the last)."""
        if (lookups := self._attached_lookups()) is not None:
            self.guard(lookups.detach, "removing the kernel timer")
        if self.split is not None:
            self.guard(self.split.detach, "removing the split model's timers")

    def gather(self) -> tuple[list[Any] | None, list[Any] | None]:
        """Meet the other ranks once: on rank 0 the manifest's (`lookup_s`, `split_cost_s`),
        None where nothing was timed (and on the other ranks)."""
        lookups = self.guard(
            lambda: gather_to_rank0(self.lookup_s), "gathering kernel times on rank 0"
        )
        splits = self.guard(
            lambda: gather_to_rank0(self.split_s), "gathering the split model's times on rank 0"
        )
        return (
            lookup_record(lookups) if lookups else None,
            split_cost_record(splits) if splits else None,
        )
