"""Measure plans against each other with the training harness (`sparselift bench`).

Runs are interleaved (A B A B …, one round = every contender once) so that drift of a shared
machine — thermal, other jobs — hits every plan alike; each contender's figure is the median of its
rounds' steps/s, and the ratio is to the first contender. Every plan is validated before anything trains.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.workloads.harness import TrainConfig, run_training

TORCHREC = "torchrec"


@dataclass
class Contender:
    label: str
    plan: str | None  # None: TorchRec's planner for the real topology
    steps_per_s: list[float] = field(default_factory=list)  # one per round

    @property
    def median(self) -> float:
        return statistics.median(self.steps_per_s)


@dataclass
class BenchResult:
    workload: str
    nproc: int
    rounds: int
    steps: int
    contenders: list[Contender]

    def ratio(self, c: Contender) -> float:
        return c.median / self.contenders[0].median

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "nproc": self.nproc,
            "rounds": self.rounds,
            "steps": self.steps,
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
        w = max(8, *(len(c.label) for c in self.contenders))
        lines = [
            f"{self.workload}: {self.nproc} ranks, {self.rounds} rounds × {self.steps} steps, interleaved",
            f"  {'plan':{w}s} {'steps/s':>9s} {'min':>9s} {'max':>9s} {'ratio':>7s}",
        ]
        for c in self.contenders:
            lines.append(
                f"  {c.label:{w}s} {c.median:9.2f} {min(c.steps_per_s):9.2f} {max(c.steps_per_s):9.2f} "
                f"{self.ratio(c):7.3f}"
            )
        return "\n".join(lines)


def contenders_for(plans: list[str], vs_torchrec: bool) -> list[Contender]:
    """Label each plan by its file name (its path if names clash); TorchRec's plan last."""
    names = [Path(p).name for p in plans]
    out = [Contender(label=n if names.count(n) == 1 else p, plan=p) for n, p in zip(names, plans)]
    if vs_torchrec:
        out.append(Contender(label=TORCHREC, plan=None))
    if not out:
        raise UserError("nothing to measure: give --plan at least once, or --vs torchrec")
    return out


def run_bench(
    base: TrainConfig, contenders: list[Contender], rounds: int = 3, echo=None
) -> BenchResult:
    """Validate every contender, then train them interleaved for `rounds` rounds."""
    if rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {rounds}")
    configs = [dataclasses.replace(base, plan=c.plan) for c in contenders]
    spec = None
    for cfg in configs:
        spec = cfg.validate()  # plan vs workload and world size: all refused before any training
    for r in range(rounds):
        for c, cfg in zip(contenders, configs):
            result = run_training(cfg)
            c.steps_per_s.append(result.steps_per_s)
            if echo:
                echo(f"round {r + 1}/{rounds} {c.label}: {result.steps_per_s:.2f} steps/s")
    return BenchResult(
        workload=spec.name, nproc=base.nproc, rounds=rounds, steps=base.steps, contenders=contenders
    )
