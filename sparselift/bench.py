"""Measure plans against each other with the training harness (`sparselift bench`).

By default the plans train side by side in one job, taking turns of `steps` steps per round
(`workloads.side_by_side`): what separates two jobs on one host (thread placement, memory layout,
the host's load that minute) is then common to every plan. With `separate_runs` each plan trains
its own job per round instead, interleaved (A B A B …), for models too big to hold twice. Either
way one round holds every contender once, each contender's figure is the median of its rounds'
steps/s, and the ratio is to the first contender. Every plan is validated before anything trains.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.jsonfile import read_json
from sparselift.workloads.harness import MAX_ROUNDS, TrainConfig, run_training
from sparselift.workloads.side_by_side import run_side_by_side

TORCHREC = "torchrec"  # the contender label (and `--vs` value) of TorchRec's own plan
SIDE_BY_SIDE, SEPARATE = "side by side in one job", "separate jobs, interleaved"
FORMAT = "sparselift-bench"  # `bench --json` files
VERSION = 1


@dataclass
class Contender:
    """One plan being measured.

    Attributes:
        label: how the tables name it.
        plan: the plan file; None: TorchRec's planner for the real topology.
        steps_per_s: one figure per round, filled by `run_bench`.
    """

    label: str
    plan: str | None
    steps_per_s: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """The median of its rounds' steps/s."""
        return statistics.median(self.steps_per_s)


@dataclass
class BenchResult:
    """Every contender's rounds, and what they were measured on."""

    workload: str
    nproc: int
    rounds: int
    steps: int
    contenders: list[Contender]
    runs: str = SIDE_BY_SIDE  # SIDE_BY_SIDE or SEPARATE

    def ratio(self, c: Contender) -> float:
        """`c`'s median steps/s over the first contender's (> 1: `c` is faster)."""
        return c.median / self.contenders[0].median

    def to_json(self) -> dict[str, Any]:
        """The result as `bench --json` writes it: per contender its rounds, median, min, max,
        ratio."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "workload": self.workload,
            "nproc": self.nproc,
            "rounds": self.rounds,
            "steps": self.steps,
            "runs": self.runs,
            "contenders": [
                dict(
                    label=c.label,
                    plan=c.plan,
                    steps_per_s=c.steps_per_s,
                    median=c.median,
                    min=min(c.steps_per_s),
                    max=max(c.steps_per_s),
                    ratio=self.ratio(c),
                )
                for c in self.contenders
            ],
        }

    def table(self) -> str:
        """The result for people: one line per contender (median, min, max steps/s, ratio)."""
        w = max(8, *(len(c.label) for c in self.contenders))
        lines = [
            f"{self.workload}: {self.nproc} ranks, {self.rounds} rounds × {self.steps} steps, "
            f"{self.runs}",
            f"  {'plan':{w}s} {'steps/s':>9s} {'min':>9s} {'max':>9s} {'ratio':>7s}",
        ]
        for c in self.contenders:
            lines.append(
                f"  {c.label:{w}s} {c.median:9.2f} {min(c.steps_per_s):9.2f} "
                f"{max(c.steps_per_s):9.2f} {self.ratio(c):7.3f}"
            )
        return "\n".join(lines)


def read_bench_result(path: str | Path) -> dict[str, Any]:
    """Read a `bench --json` file, checked to the shape readers use (`contenders` and their keys).

    A file without `format`/`version` (written before they existed) is read if its shape fits.

    Raises:
        UserError: one line naming the file: unreadable, malformed, another format or version, or
            a contender without its label, median steps/s and ratio.
    """
    d = read_json(path, "bench result")
    if not isinstance(d, dict) or d.get("format", FORMAT) != FORMAT:
        raise UserError(f'{path}: not a bench result (expected "format": "{FORMAT}")')
    if d.get("version", VERSION) != VERSION:
        raise UserError(
            f"{path}: unsupported bench result version {d.get('version')!r} (expected {VERSION})"
        )
    contenders = d.get("contenders")
    if not isinstance(contenders, list) or not contenders:
        raise UserError(f"{path}: a bench result needs a non-empty list of contenders")
    for i, c in enumerate(contenders):
        ok = (
            isinstance(c, dict)
            and isinstance(c.get("label"), str)
            and isinstance(c.get("plan"), (str, type(None)))
            and all(_positive_number(c.get(k)) for k in ("median", "ratio"))
        )
        if not ok:
            raise UserError(
                f"{path}: contender #{i} needs a label, a plan (or null) and positive "
                f"median and ratio"
            )
    return d


def _positive_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


def contenders_for(plans: list[str], vs_torchrec: bool) -> list[Contender]:
    """The contenders of `bench --plan … [--vs torchrec]`, in that order, TorchRec's plan last.

    Each plan is labelled by its file name (its path where names clash).

    Raises:
        UserError: nothing to measure.
    """
    names = [Path(p).name for p in plans]
    out = [
        Contender(label=n if names.count(n) == 1 else p, plan=p)
        for n, p in zip(names, plans, strict=True)
    ]
    if vs_torchrec:
        out.append(Contender(label=TORCHREC, plan=None))
    if not out:
        raise UserError("nothing to measure: give --plan at least once, or --vs torchrec")
    return out


def run_bench(
    base: TrainConfig,
    contenders: list[Contender],
    rounds: int = 3,
    echo: Callable[[str], None] | None = None,
    separate_runs: bool = False,
) -> BenchResult:
    """Validate every contender, then train them for `rounds` rounds: side by side in one job,
    or with `separate_runs` one job per contender and round, interleaved.

    Args:
        base: the run every contender trains (its `plan` is replaced by each contender's).
        contenders: the plans; their `steps_per_s` are filled in.
        rounds: rounds; each contender runs `base.steps` timed steps a round.
        echo: called with one line per finished round or run (progress), if given.
        separate_runs: one job per contender and round instead of one job.
    Raises:
        UserError: `rounds` out of range, or any contender's run is refused (plan vs workload
            and world size): all checked before anything trains.
        RankFailed: a rank of a run failed.
    """
    if not 1 <= rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds must be in 1..{MAX_ROUNDS}, got {rounds:,}")
    if not contenders:
        raise UserError("nothing to measure: give --plan at least once, or --vs torchrec")
    if separate_runs:
        workload = _run_separately(base, contenders, rounds, echo)
    else:
        cfg = dataclasses.replace(
            base, plan=None, contenders=[c.plan for c in contenders], rounds=rounds
        )
        measured = run_side_by_side(cfg)  # one job: every refusal before it starts
        workload = measured.workload
        for i, c in enumerate(contenders):
            c.steps_per_s = measured.steps_per_s(i)
        if echo:
            for r in range(rounds):
                figures = ", ".join(f"{c.label} {c.steps_per_s[r]:.2f}" for c in contenders)
                echo(f"round {r + 1}/{rounds}: {figures} steps/s")
    return BenchResult(
        workload=workload,
        nproc=base.nproc,
        rounds=rounds,
        steps=base.steps,
        contenders=contenders,
        runs=SEPARATE if separate_runs else SIDE_BY_SIDE,
    )


def _run_separately(
    base: TrainConfig,
    contenders: list[Contender],
    rounds: int,
    echo: Callable[[str], None] | None,
) -> str:
    """`run_bench`'s separate jobs, interleaved; the workload's name."""
    configs = [dataclasses.replace(base, plan=c.plan) for c in contenders]
    specs = [cfg.validate() for cfg in configs]  # every refusal before any training
    for r in range(rounds):
        for c, cfg in zip(contenders, configs, strict=True):
            result = run_training(cfg)
            c.steps_per_s.append(result.steps_per_s)
            if echo:
                echo(f"round {r + 1}/{rounds} {c.label}: {result.steps_per_s:.2f} steps/s")
    return specs[0].name
