"""The training harness: real DistributedModelParallel training of a workload on N ranks.

`run_training(TrainConfig)` is the Python entry point every stage reuses (train, profile, bench):
it validates inputs in the calling process (so bad input fails before any rank starts), launches
the ranks (`launch.py`), and turns their per-rank results into a `TrainResult`. What each rank
runs is `rank.train_rank`; a `hook` (an importable "module:factory") lets another stage — the
profiler — observe the steps without the harness importing it.

On several hosts every host runs the same command with its `node_rank` (torchrun's flags); every
host's `run_training` returns the whole run's result. Started by an external launcher instead
(torchrun, or SLURM's srun: `in_place.launched_externally`), the calling process is itself one
rank and trains in place.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.workloads.in_place import launched_externally, run_in_place
from sparselift.workloads.launch import launch, rank_malloc_env
from sparselift.workloads.spec import MAX_BATCH_SIZE, WorkloadSpec, load_workload

PIPELINES = ("base", "sparse-dist")
DEVICES = ("auto", "cpu", "cuda")
MAX_NPROC = 1024  # local ranks of one run
MAX_STEPS = 1_000_000  # steps (and warm-up steps) of one run
MAX_SEED = 2**32 - 1
MAX_ROUNDS = 1000  # rounds of a side-by-side run (and of `bench`'s separate runs)
MAX_CONTENDERS = 16  # plans of one side-by-side run


@dataclass
class TrainConfig:
    """One training run: what to train, on how many ranks, for how long, observed by what.

    Attributes:
        workload: a built-in workload name or a spec file path.
        nproc: ranks to launch on this host.
        steps: measured steps (after `warmup`).
        warmup: steps before measuring.
        max_rows: hash ids into at most this many rows per table; None for the real sizes.
        plan: a SparseLift plan file; None: TorchRec's planner for the real topology.
        pipeline: "base" or "sparse-dist"; None: the plan's choice, else "base".
        batch_size: samples per rank; None: the workload's.
        seed: seeds the model and the synthetic batches.
        data: a directory of TorchRec-preprocessed Criteo .npy day files instead of synthetic
            batches.
        device: "auto" (CUDA if available), "cpu" or "cuda".
        hook: "module:factory" called with a RankContext on every rank (see docs/CONTRACTS.md).
        hook_args: keyword arguments of the hook factory (JSON-able).
        progress: rank 0 reports steps on stdout as they finish.
        nnodes, node_rank, rdzv_endpoint, rdzv_id, rdzv_timeout_s: the hosts (`launch.Nodes`);
            `nproc` ranks run on each.
        contenders: plan files trained side by side in this one job (None: TorchRec's
            planner), in turns (`side_by_side.py`); `plan` is then None.
        rounds: turns of a side-by-side job; each contender steps `steps` timed steps a turn.
    """

    workload: str
    nproc: int = 2
    steps: int = 30
    warmup: int = 5
    max_rows: int | None = None
    plan: str | None = None
    pipeline: str | None = None
    batch_size: int | None = None
    seed: int = 0
    data: str | None = None
    device: str = "auto"
    hook: str | None = None
    hook_args: dict[str, Any] = field(default_factory=dict)
    progress: bool = False
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_timeout_s: int = 120
    contenders: list[str | None] = field(default_factory=list)
    rounds: int = 1

    @property
    def world_size(self) -> int:
        """Ranks of the whole run: `nproc` on each of `nnodes` hosts."""
        return self.nproc * self.nnodes

    def nodes(self) -> Any:
        """The hosts, as `launch.Nodes`."""
        from sparselift.workloads.launch import Nodes

        return Nodes(
            self.nnodes, self.node_rank, self.rdzv_endpoint, self.rdzv_id, self.rdzv_timeout_s
        )

    def validate(self) -> WorkloadSpec:
        """Check everything that can be checked before ranks start.

        Returns:
            The workload, uncapped.
        Raises:
            UserError: a number out of range (named by its flag), an unknown pipeline or
                device, a bad workload, data directory or plan, or a plan that does not fit the
                workload (capped by `max_rows`) on `nproc` ranks. PlanError is a UserError too.
        """
        _check_range("--nproc", self.nproc, 1, MAX_NPROC)
        _check_range("--steps", self.steps, 1, MAX_STEPS)
        _check_range("--warmup", self.warmup, 0, MAX_STEPS)
        _check_range("--seed", self.seed, 0, MAX_SEED)
        self.nodes().validate()
        if self.pipeline is not None and self.pipeline not in PIPELINES:
            raise UserError(
                f"--pipeline must be one of {', '.join(PIPELINES)}, got {self.pipeline!r}"
            )
        if self.device not in DEVICES:
            raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.batch_size is not None:
            _check_range("--batch-size", self.batch_size, 1, MAX_BATCH_SIZE)
        if self.data is not None:
            from sparselift.workloads.criteo import day_files

            day_files(self.data)
        spec = load_workload(self.workload)
        capped = spec.capped(self.max_rows)  # a bad --max-rows is refused here, before any rank
        if self.contenders:
            if self.plan is not None:
                raise UserError("a side-by-side run takes its plans as contenders, not --plan")
            _check_range("--rounds", self.rounds, 1, MAX_ROUNDS)
            if len(self.contenders) > MAX_CONTENDERS:
                raise UserError(
                    f"at most {MAX_CONTENDERS} plans side by side, got {len(self.contenders)}"
                )
        for plan in [self.plan, *self.contenders]:
            if plan is not None:
                from sparselift import plans

                plans.load(plan).check_spec(capped.fingerprints(), self.world_size)
        return spec


def _check_range(flag: str, value: int, low: int, high: int) -> None:
    """UserError naming `flag` unless low <= value <= high."""
    if not low <= value <= high:
        raise UserError(f"{flag} must be in {low}..{high:,}, got {value:,}")


@dataclass
class RankResult:
    """What one rank reports: its step times, peak memory, and what its hook returned.

    Attributes:
        rank: the rank.
        step_times_s: every step's wall time, warm-up included, in seconds.
        peak_memory_bytes: peak device memory (CUDA) or peak resident set size (CPU).
        pipeline: the train pipeline it ran ("base" or "sparse-dist").
        device: "cpu" or "cuda".
        backend: the process group's backend ("gloo" or "nccl").
        extra: what the hook's `finish()` returned ({} without a hook).
    """

    rank: int
    step_times_s: list[float]
    peak_memory_bytes: int
    pipeline: str
    device: str
    backend: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainResult:
    """The steady state of a run, from every rank's step times.

    A step's time is the slowest rank's (ranks wait for each other); figures are over the
    measured steps only.

    Attributes:
        workload: the workload's name.
        world_size: ranks.
        batch_size: samples per rank.
        steps: measured steps.
        warmup: steps before them.
        pipeline, device, backend: as rank 0 ran.
        steps_per_s: 1 / the median step time.
        samples_per_s: global samples per second (steps_per_s × batch_size × world_size).
        step_time_s_median, step_time_s_min, step_time_s_max: over the measured steps.
        peak_memory_bytes: per rank.
        ranks: every rank's own result.
    """

    workload: str
    world_size: int
    batch_size: int
    steps: int
    warmup: int
    pipeline: str
    device: str
    backend: str
    steps_per_s: float
    samples_per_s: float
    step_time_s_median: float
    step_time_s_min: float
    step_time_s_max: float
    peak_memory_bytes: list[int]
    ranks: list[RankResult]

    def to_json(self) -> dict[str, Any]:
        """Every field, ranks included, as a JSON-able dict (`train --json`)."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """Four lines for people: the run, steps/s and step times, samples/s, peak memory."""
        mem = ", ".join(
            f"rank {r}: {m / 2**20:.0f} MiB" for r, m in enumerate(self.peak_memory_bytes)
        )
        return (
            f"{self.workload}: {self.world_size} ranks ({self.device}/{self.backend}), "
            f"pipeline {self.pipeline}, batch {self.batch_size}/rank, {self.steps} steps after "
            f"{self.warmup} warm-up\n"
            f"  steps/s   {self.steps_per_s:.2f}  "
            f"(step median {self.step_time_s_median * 1e3:.1f} ms, "
            f"min {self.step_time_s_min * 1e3:.1f}, max {self.step_time_s_max * 1e3:.1f})\n"
            f"  samples/s {self.samples_per_s:.0f}\n"
            f"  peak memory {mem}"
        )


def run_training(cfg: TrainConfig) -> TrainResult:
    """Train `cfg` on `cfg.nproc` local ranks (of each host) and return the steady-state figures.

    Inside an external launcher (`launched_externally`) this process is one rank: it trains in
    place, `nproc` and the hosts come from the launcher's environment.

    Raises:
        UserError: `cfg.validate()` refuses it; nothing is launched.
        RankFailed: a rank failed (the others are stopped); its error is the message.
    """
    spec, ranks = run_ranks(cfg)
    return train_result(cfg, spec, ranks)


def run_ranks(cfg: TrainConfig) -> tuple[WorkloadSpec, list[RankResult]]:
    """Validate `cfg`, run its ranks (launched here, or this process as one rank of an external
    launch) and read back every rank's result: (the workload, uncapped; the results in rank
    order).

    The ranks start with glibc malloc's thresholds fixed (`rank_malloc_env`), so a step's time
    does not depend on what the rank allocated and freed before it.

    Raises:
        UserError: `cfg.validate()` refuses it; nothing is launched.
        RankFailed: a rank failed (the others are stopped); its error is the message.
    """
    if launched_externally():
        spec, results = run_in_place(cfg)
        return spec, [RankResult(**r) for r in results]
    spec = cfg.validate()
    with tempfile.TemporaryDirectory(prefix="sparselift-run-") as tmp:
        cfg_path = Path(tmp, "config.json")
        cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
        with rank_malloc_env():
            launch(
                cfg.nproc, "sparselift.workloads.worker", [str(cfg_path), tmp], nodes=cfg.nodes()
            )
        ranks = []
        for r in range(cfg.world_size):
            path = Path(tmp, f"rank{r}.json")
            if not path.exists():
                raise RuntimeError(f"rank {r} exited without writing its result")
            ranks.append(RankResult(**json.loads(path.read_text())))
    return spec, ranks


def train_result(cfg: TrainConfig, spec: WorkloadSpec, ranks: list[RankResult]) -> TrainResult:
    """The run's TrainResult: per measured step the slowest rank's time, then the median.

    Args:
        cfg: the run's configuration (its warm-up and measured steps).
        spec: the workload (its name and batch size, unless `cfg` sets one).
        ranks: every rank's result, in rank order.
    """
    per_step = [
        max(r.step_times_s[i] for r in ranks) for i in range(cfg.warmup, cfg.warmup + cfg.steps)
    ]
    med = statistics.median(per_step)
    batch = cfg.batch_size or spec.batch_size
    return TrainResult(
        workload=spec.name,
        world_size=len(ranks),
        batch_size=batch,
        steps=cfg.steps,
        warmup=cfg.warmup,
        pipeline=ranks[0].pipeline,
        device=ranks[0].device,
        backend=ranks[0].backend,
        steps_per_s=1.0 / med,
        samples_per_s=batch * len(ranks) / med,
        step_time_s_median=med,
        step_time_s_min=min(per_step),
        step_time_s_max=max(per_step),
        peak_memory_bytes=[r.peak_memory_bytes for r in ranks],
        ranks=ranks,
    )
