"""Steady steps: the steps right after the profiled window, timed with nothing attached.

The profiled window runs slower than training does (the profiler records every op, its buffers
grow, the access recorder keeps the window's inputs). So the calibration needs the step as it runs
unprofiled, from the same process and plan: after the window (its trace written, its hooks gone)
the session times `n` more steps with `perf_counter` only, and the manifest gets `steady_step_s`,
one float per steady step, each the slowest rank's time (as `step_times_s` defines a step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from sparselift.profiler.gather import gather_to_rank0


@dataclass
class SteadyTimer:
    """Times up to `n` steps on this rank; `gather` meets the other ranks once, on rank 0.

    Attributes:
        n: steps to time (0: none; then nothing is timed and nothing is gathered).
        device: this rank's device (CUDA is synchronized before a step's end is read, as in the
            window).
        times_s: the steps timed so far, in seconds.
    """

    n: int
    device: torch.device
    times_s: list[float] = field(default_factory=list)
    _t0: float | None = None

    @property
    def complete(self) -> bool:
        """All `n` steps are timed."""
        return len(self.times_s) >= self.n

    def begin(self) -> None:
        """A step starts (ignored once `n` steps are timed)."""
        if not self.complete:
            self._t0 = time.perf_counter()

    def end(self) -> None:
        """The step begun last has ended: record its time."""
        if self._t0 is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times_s.append(time.perf_counter() - self._t0)
        self._t0 = None

    def drop_open_step(self) -> None:
        """Forget a step that was begun but never ran (the loop ended)."""
        self._t0 = None

    def gather(self) -> list[float] | None:
        """Every rank's times on rank 0, per step the slowest rank's; None on other ranks.

        Every rank must call this exactly once, at the same point (the n-th steady step, or the
        end of training, whichever comes first: ranks of one job train the same steps). Steps
        that some rank did not time are left out.
        """
        per_rank = gather_to_rank0(list(self.times_s))
        if per_rank is None:
            return None
        common = min(len(t) for t in per_rank)
        return [max(float(t[i]) for t in per_rank) for i in range(common)]
