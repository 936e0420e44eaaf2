"""The training harness: real DistributedModelParallel training of a workload on N ranks.

`run_training(TrainConfig)` is the Python entry point every stage reuses (train, profile, bench):
it validates inputs in the calling process (so bad input fails before any rank starts), launches the
ranks (`launch.py`), and turns their per-rank results into a `TrainResult`. `train_rank` is what each
rank runs; a `hook` (an importable "module:factory") lets another stage — the profiler — observe the
steps without the harness importing it.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sparselift.errors import UserError
from sparselift.workloads.spec import WorkloadSpec, load_workload

PIPELINES = ("base", "sparse-dist")
AHEAD_BYTES = 1 << 30  # at most this much of a run's batches is made before its first step
PIPELINE_DEPTH = 2  # batches a train pipeline takes beyond the one it steps on


@dataclass
class TrainConfig:
    workload: str
    nproc: int = 2
    steps: int = 30
    warmup: int = 5
    max_rows: int | None = None
    plan: str | None = (
        None  # a SparseLift plan file; None: TorchRec's planner for the real topology
    )
    pipeline: str | None = None  # None: the plan's choice, else "base"
    batch_size: int | None = None  # per rank; None: the workload's
    seed: int = 0
    data: str | None = None  # directory of TorchRec-preprocessed Criteo .npy day files
    device: str = "auto"  # auto | cpu | cuda
    hook: str | None = None  # "module:factory" called with a RankContext on every rank
    hook_args: dict[str, Any] = field(default_factory=dict)
    progress: bool = False  # rank 0 reports steps on stdout as they finish

    def validate(self) -> WorkloadSpec:
        """Check everything that can be checked before ranks start; return the workload."""
        if self.nproc < 1:
            raise UserError(f"--nproc must be at least 1, got {self.nproc}")
        if self.steps < 1:
            raise UserError(f"--steps must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise UserError(f"--warmup must be >= 0, got {self.warmup}")
        if self.pipeline is not None and self.pipeline not in PIPELINES:
            raise UserError(
                f"--pipeline must be one of {', '.join(PIPELINES)}, got {self.pipeline!r}"
            )
        if self.batch_size is not None and self.batch_size < 1:
            raise UserError(f"--batch-size must be positive, got {self.batch_size}")
        if self.data is not None:
            from sparselift.workloads.criteo import day_files

            day_files(self.data)
        spec = load_workload(self.workload)
        capped = spec.capped(
            self.max_rows
        )  # a bad --max-rows is refused here, before any rank starts
        if self.plan is not None:
            from sparselift import plans

            plans.load(self.plan).check_spec(capped.fingerprints(), self.nproc)
        return spec


@dataclass
class RankResult:
    rank: int
    step_times_s: list[float]
    peak_memory_bytes: int
    pipeline: str
    device: str
    backend: str
    extra: dict[str, Any] = field(default_factory=dict)  # what a hook returned


@dataclass
class TrainResult:
    workload: str
    world_size: int
    batch_size: int  # per rank
    steps: int
    warmup: int
    pipeline: str
    device: str
    backend: str
    steps_per_s: float  # 1 / median over measured steps of the slowest rank's step time
    samples_per_s: float  # global: steps_per_s * batch_size * world_size
    step_time_s_median: float
    step_time_s_min: float
    step_time_s_max: float
    peak_memory_bytes: list[int]  # per rank
    ranks: list[RankResult]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        mem = ", ".join(
            f"rank {r}: {m / 2**20:.0f} MiB" for r, m in enumerate(self.peak_memory_bytes)
        )
        return (
            f"{self.workload}: {self.world_size} ranks ({self.device}/{self.backend}), pipeline {self.pipeline}, "
            f"batch {self.batch_size}/rank, {self.steps} steps after {self.warmup} warm-up\n"
            f"  steps/s   {self.steps_per_s:.2f}  (step median {self.step_time_s_median * 1e3:.1f} ms, "
            f"min {self.step_time_s_min * 1e3:.1f}, max {self.step_time_s_max * 1e3:.1f})\n"
            f"  samples/s {self.samples_per_s:.0f}\n"
            f"  peak memory {mem}"
        )


def run_training(cfg: TrainConfig) -> TrainResult:
    """Train `cfg` on `cfg.nproc` local ranks and return the steady-state figures."""
    from sparselift.workloads.launch import launch

    spec = cfg.validate()
    with tempfile.TemporaryDirectory(prefix="sparselift-run-") as tmp:
        cfg_path = Path(tmp, "config.json")
        cfg_path.write_text(json.dumps(dataclasses.asdict(cfg)))
        launch(cfg.nproc, "sparselift.workloads.worker", [str(cfg_path), tmp])
        ranks = []
        for r in range(cfg.nproc):
            path = Path(tmp, f"rank{r}.json")
            if not path.exists():
                raise RuntimeError(f"rank {r} exited without writing its result")
            ranks.append(RankResult(**json.loads(path.read_text())))
    return summarize(cfg, spec, ranks)


def summarize(cfg: TrainConfig, spec: WorkloadSpec, ranks: list[RankResult]) -> TrainResult:
    """Steady state: per measured step the slowest rank's time, then the median over steps."""
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


# ----------------------------------------------------------------------------------------- per rank


@dataclass
class RankContext:
    """What a hook sees on its rank once the model is sharded and the pipeline built."""

    cfg: TrainConfig
    spec: WorkloadSpec  # capped by max_rows: the tables as trained
    rank: int
    world_size: int
    local_world_size: int
    device: Any  # torch.device
    backend: str
    model: Any  # DistributedModelParallel
    pipeline: Any  # a TorchRec TrainPipeline
    plan: Any  # sparselift.plans.Plan or None


class StepHook(Protocol):
    def step_begin(self, step: int) -> None: ...
    def step_end(self, step: int) -> None: ...
    def finish(self) -> dict[str, Any]: ...


def load_hook(cfg: TrainConfig, ctx: RankContext) -> StepHook | None:
    if not cfg.hook:
        return None
    module, _, name = cfg.hook.partition(":")
    return getattr(importlib.import_module(module), name)(ctx, **cfg.hook_args)


def peak_memory_bytes(device) -> int:
    """Peak device memory on CUDA; peak resident set size of the process on CPU."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def batches_for_rank(
    cfg: TrainConfig, spec: WorkloadSpec, rank: int, world_size: int
) -> Iterator[Any]:
    if cfg.data:
        from sparselift.workloads.criteo import criteo_batches

        return criteo_batches(
            cfg.data,
            cfg.batch_size or spec.batch_size,
            rank,
            world_size,
            [t.num_embeddings for t in spec.capped(cfg.max_rows).tables],
        )
    from sparselift.workloads.batches import SyntheticBatches

    return iter(
        SyntheticBatches(
            spec, rank=rank, seed=cfg.seed, max_rows=cfg.max_rows, batch_size=cfg.batch_size
        )
    )


def made_ahead(batches: Iterator[Any], n: int, budget: int = AHEAD_BYTES) -> Iterator[Any]:
    """The stream's first `n` batches made before the timed loop, as TorchRec's own benchmarks do: a
    trainer's data loader runs beside the step, so a step should time training, not the synthesis
    (or file reading) of its batch. Past `budget` bytes the rest of the stream comes as needed."""
    first, size = [], 0
    for b in itertools.islice(batches, n):
        first.append(b)
        kjt = b.sparse_features
        size += sum(t.nbytes for t in (kjt.values(), kjt.lengths(), b.dense_features, b.labels))
        if size >= budget:
            break
    return itertools.chain(first, batches)


def train_rank(cfg: TrainConfig) -> RankResult:
    """One rank of the job: build, shard, train, time. Needs the torch.distributed env variables."""
    import torch
    import torch.distributed as dist

    from sparselift.workloads.sharding import build_optimizer, make_pipeline, shard

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend=backend)
    torch.manual_seed(cfg.seed)

    spec = load_workload(cfg.workload)
    trained = spec.capped(cfg.max_rows)
    plan = None
    if cfg.plan:
        from sparselift import plans

        plan = plans.load(cfg.plan)
    model = shard(trained, dist.GroupMember.WORLD, device, plan=plan, local_world_size=local_world)
    optimizer = build_optimizer(model)
    pipeline_name = cfg.pipeline or (plan.pipeline if plan is not None else "base")
    pipeline = make_pipeline(pipeline_name, model, optimizer, device)
    ctx = RankContext(
        cfg=cfg,
        spec=trained,
        rank=rank,
        world_size=world,
        local_world_size=local_world,
        device=device,
        backend=backend,
        model=model,
        pipeline=pipeline,
        plan=plan,
    )
    hook = load_hook(cfg, ctx)
    total = cfg.warmup + cfg.steps
    batches = made_ahead(batches_for_rank(cfg, spec, rank, world), total + PIPELINE_DEPTH)

    times = []
    every = max(1, total // 10)
    for step in range(total):
        if hook:
            hook.step_begin(step)
        t0 = time.perf_counter()
        pipeline.progress(batches)
        if use_cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        if hook:
            hook.step_end(step)
        if cfg.progress and rank == 0 and ((step + 1) % every == 0 or step + 1 == total):
            phase = "warm-up" if step < cfg.warmup else "measured"
            print(f"  step {step + 1}/{total} ({phase}) {times[-1] * 1e3:.1f} ms", flush=True)
    extra = hook.finish() if hook else {}
    dist.barrier()
    return RankResult(
        rank=rank,
        step_times_s=times,
        peak_memory_bytes=peak_memory_bytes(device),
        pipeline=pipeline_name,
        device=device.type,
        backend=backend,
        extra=extra,
    )
