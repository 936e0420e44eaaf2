"""Every rank's trace files into rank 0's profile directory at the end of the window, and which
ranks' traces did not arrive (named in the manifest's `missing_ranks` and `errors`)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparselift.profiler.gather import gather_files
from sparselift.profiler.trace import trace_name

if TYPE_CHECKING:
    from sparselift.profiler.merge import RankReport

# Runs a step and returns its result; a failure is caught, recorded and gives None.
Guard = Callable[[Callable[[], Any], str], Any]


def collect_traces(
    rank: int,
    files: list[str],
    trace_dir: Path,
    out_dir: Path,
    reports: list[RankReport] | None,
    guard: Guard,
) -> tuple[list[str], list[str]]:
    """Stream the other ranks' trace files into rank 0's directory (`gather.gather_files`).

    Every rank must call this once, at the same point. A rank other than 0 removes its
    `trace_dir` afterwards, and records through `guard` that its trace did not arrive.

    Args:
        rank: this rank.
        files: this rank's trace files, by name in `trace_dir`.
        trace_dir: where this rank wrote them: rank 0's is `out_dir`, the others' a private
            temp directory.
        out_dir: the profile directory on rank 0.
        reports: on rank 0 every rank's report; each one's `files` is set to those that
            arrived. None on the other ranks.
        guard: the session's (every failure is caught and recorded: the profiler never stops
            training).
    Returns:
        This rank's files afterwards (on a rank other than 0 those that arrived, unchanged
        if the gather itself failed), and on rank 0 one error per rank whose trace is missing
        ([] on the others).
    """
    paths = [trace_dir / f for f in files]
    got = guard(lambda: gather_files(paths, out_dir), "sending traces to rank 0")
    if rank != 0:
        shutil.rmtree(trace_dir, ignore_errors=True)
        if got is None:
            return files, []
        names, why = got.get(rank, ([], None))
        if files and trace_name(rank) not in names:
            guard(lambda: _raise(OSError(why)), f"writing traces to {out_dir} on rank 0")
        return names, []
    missing: list[str] = []
    for r in reports or []:
        if r.rank == 0:
            continue
        names, why = got.get(r.rank, ([], "not received")) if got else ([], "not received")
        r.files = names
        if trace_name(r.rank) not in names:
            missing.append(f"rank {r.rank}'s trace is missing: {why or 'not written'}")
    return files, missing


def _raise(e: Exception) -> None:
    raise e
