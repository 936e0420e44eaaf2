"""Run one function per rank's trace in a pool of worker processes; what that cost.

The per-rank work of the analysis (`profile.load_profile`, `rankwork.load_ranks`) runs here, one
task per rank, so that it uses every core and a worker holds one rank's trace at a time.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sparselift.errors import UserError

R = TypeVar("R")


@dataclass(frozen=True)
class ParseStats:
    """What parsing a profile's traces and the per-rank work done with them cost.

    Attributes:
        ranks: traces parsed (or read from the cache).
        trace_mib: their total size on disk (MiB, compressed as stored).
        wall_s: wall time from the first trace to the last.
        workers: processes that parsed (1: in this process).
        peak_rss_mib: this process's peak resident memory so far.
        worker_peak_rss_mib: the largest peak of any worker process (None with one worker).
    """

    ranks: int
    trace_mib: float
    wall_s: float
    workers: int
    peak_rss_mib: float
    worker_peak_rss_mib: float | None

    def line(self) -> str:
        """One line for the console."""
        per = (
            f", {self.worker_peak_rss_mib:.0f} MiB per worker"
            if self.worker_peak_rss_mib is not None
            else ""
        )
        return (
            f"parsed {self.ranks} traces ({self.trace_mib:.1f} MiB) and made their nodes in "
            f"{self.wall_s:.2f} s with "
            f"{self.workers} worker{'s' if self.workers > 1 else ''}; peak RSS "
            f"{self.peak_rss_mib:.0f} MiB here{per}"
        )


def worker_count(world: int, workers: int | None = None) -> int:
    """Processes to parse `world` traces with: `workers`, else the cores.

    Never more than `world`.

    Raises:
        UserError: `workers` below 1.
    """
    n = workers if workers is not None else os.cpu_count() or 1
    if n < 1:
        raise UserError(f"workers must be at least 1, got {n}")
    return max(1, min(n, world))


def rss_mib() -> float:
    """This process's peak resident memory so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_per_rank(
    fn: Callable[..., tuple[R, float]],
    paths: list[Path],
    ranks: list[int],
    workers: int,
    *args: Any,
) -> tuple[list[R], float | None]:
    """`fn(path, rank, *args)` for each rank's trace, in `workers` processes (1: here).

    `fn` returns its result and its process's peak RSS (MiB).

    Returns:
        The results in rank order, and the workers' largest peak RSS (None with one worker).
    Raises:
        What `fn` raises: the lowest failing rank's error; ranks not yet started are dropped.
    """
    if workers == 1:
        return [fn(p, r, *args)[0] for r, p in zip(ranks, paths, strict=True)], None
    # fork: a worker starts with the analysis modules imported and needs no importable __main__
    # (scripts and notebooks without a main guard); it only reads its trace and computes, so the
    # threads a fork leaves behind are not missed
    fork = "fork" in multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if fork else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(fn, p, r, *args) for r, p in zip(ranks, paths, strict=True)]
        try:
            done = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return [res for res, _ in done], max(m for _, m in done)
