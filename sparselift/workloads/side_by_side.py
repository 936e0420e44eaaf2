"""Plans trained side by side in one job, in turns: how `bench` and `tune`'s A/B measure.

Each rank builds one sharded model per contender (the same seed: the same initial weights and
the same batches), warms each up, then runs `rounds` rounds. In a round every contender takes a
turn, the order rotated a place per round: one untimed step (it runs on the caches the previous
contender left), then `steps` timed ones. So every contender runs in the same processes, on the
same host, seconds apart. What differs between two separate jobs — where each process's
threads landed, its memory layout, the host's load that minute — is then common to all of them,
and a ratio measures the plans rather than the jobs. The price: every contender's model is in
memory at once.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sparselift.errors import UserError
from sparselift.workloads.harness import RankResult, TrainConfig, run_ranks
from sparselift.workloads.rank import build_trainee, init_rank, peak_memory_bytes


def turns(n: int, round_index: int) -> list[int]:
    """The contenders' order in round `round_index`: 0..n-1 rotated by the round, so that no
    contender always follows the same one."""
    first = round_index % n
    return [*range(first, n), *range(first)]


def train_side_by_side(cfg: TrainConfig) -> RankResult:
    """This rank's part of a side-by-side job (`cfg.contenders`). Needs the torch.distributed env
    variables.

    Returns:
        The RankResult: `extra["side_by_side"]` holds the timed steps per contender and round,
        `extra["steps"]` every step per contender in its own order (warm-up and untimed steps
        too: the steps its hook saw), `extra["hooks"]` each contender's hook's `finish()` ({}
        without a hook); `step_times_s` is every timed step, contender by contender.
    """
    import torch.distributed as dist

    setup = init_rank(cfg)
    n = len(cfg.contenders)
    switch = n > 1  # each turn starts with an untimed step
    per_trainee = cfg.warmup + cfg.rounds * (int(switch) + cfg.steps)
    trainees = [
        build_trainee(cfg, setup, plan, per_trainee, contender=i)
        for i, plan in enumerate(cfg.contenders)
    ]
    steps: list[list[float]] = [[] for _ in range(n)]  # each trainee's steps so far, in order

    def step(i: int) -> float:
        seconds = trainees[i].step(len(steps[i]))
        steps[i].append(seconds)
        return seconds

    for i in range(n):
        for _ in range(cfg.warmup):
            step(i)
    timed: list[list[list[float]]] = [[] for _ in range(n)]
    for r in range(cfg.rounds):
        for i in turns(n, r):
            if switch:
                step(i)
            timed[i].append([step(i) for _ in range(cfg.steps)])
        if cfg.progress and setup.rank == 0:
            medians = ", ".join(f"{statistics.median(timed[i][r]) * 1e3:.1f}" for i in range(n))
            print(f"  round {r + 1}/{cfg.rounds}: median step {medians} ms", flush=True)
    extras = [t.hook.finish() if t.hook else {} for t in trainees]
    dist.barrier()
    return RankResult(
        rank=setup.rank,
        step_times_s=[s for rounds in timed for turn in rounds for s in turn],
        peak_memory_bytes=peak_memory_bytes(setup.device),
        pipeline=",".join(t.pipeline_name for t in trainees),
        device=setup.device.type,
        backend=setup.backend,
        extra={"side_by_side": timed, "steps": steps, "hooks": extras},
    )


@dataclass
class SideBySide:
    """What a side-by-side job measured.

    Attributes:
        workload: the workload's name.
        step_times_s: per contender, per round, each timed step's time on its slowest rank.
        peak_memory_bytes: per rank, with every contender's model in memory.
        rank_steps_s: per contender, per rank, every step it ran (warm-up and each turn's
            untimed step too), in its own order.
        hooks: per contender, per rank, its hook's `finish()` ({} without a hook).
    """

    workload: str
    step_times_s: list[list[list[float]]]
    peak_memory_bytes: list[int]
    rank_steps_s: list[list[list[float]]]
    hooks: list[list[dict[str, Any]]]

    def steps_per_s(self, contender: int) -> list[float]:
        """Per round, 1 / the median of `contender`'s timed steps in that round."""
        return [1.0 / statistics.median(turn) for turn in self.step_times_s[contender]]


def run_side_by_side(cfg: TrainConfig) -> SideBySide:
    """Train `cfg.contenders` side by side on `cfg.nproc` ranks (`run_ranks`) and collect the
    slowest rank's time of every timed step.

    Raises:
        UserError: no contenders, or `cfg.validate()` refuses the job; nothing is launched.
        RankFailed: a rank failed (the others are stopped); its error is the message.
    """
    if not cfg.contenders:
        raise UserError("a side-by-side run needs at least one plan")
    spec, ranks = run_ranks(cfg)
    per_rank: list[Any] = [r.extra["side_by_side"] for r in ranks]
    times = [
        [[max(p[c][r][i] for p in per_rank) for i in range(cfg.steps)] for r in range(cfg.rounds)]
        for c in range(len(cfg.contenders))
    ]
    contenders = range(len(cfg.contenders))
    return SideBySide(
        spec.name,
        times,
        [r.peak_memory_bytes for r in ranks],
        [[r.extra["steps"][c] for r in ranks] for c in contenders],
        [[r.extra["hooks"][c] for r in ranks] for c in contenders],
    )
