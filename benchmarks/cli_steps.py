"""The `sparselift` command line as the benchmarks drive it: each step echoed, a failing step stops
the benchmark. `log` is where the echo and the commands' own output go (stdout, or stderr for a
benchmark whose stdout is only its table)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TextIO

CLI = [sys.executable, "-m", "sparselift.cli"]


def sh(*args: str, log: TextIO | None = None) -> None:
    log = log or sys.stdout
    print("$ sparselift " + " ".join(args), file=log, flush=True)
    subprocess.run([*CLI, *args], check=True, stdout=None if log is sys.stdout else log)


def plan_from_profile(
    workload: str,
    nproc: int,
    max_rows: int,
    time_limit: float,
    out: Path,
    plan: Path,
    baseline_out: Path | None = None,
    log: TextIO | None = None,
) -> None:
    """profile → analyze → `optimize --profile`: the plan SparseLift makes for this job, written
    to `plan` (and TorchRec's plan for the same inputs to `baseline_out`); the profile stays in
    `out`."""
    sh(
        "profile",
        "--workload",
        workload,
        "--nproc",
        str(nproc),
        "--max-rows",
        str(max_rows),
        "--out",
        str(out),
        log=log,
    )
    sh("analyze", str(out), log=log)
    sh(
        "optimize",
        "--profile",
        str(out),
        "--time-limit",
        str(time_limit),
        "--out",
        str(plan),
        *(["--baseline-out", str(baseline_out)] if baseline_out else []),
        log=log,
    )
