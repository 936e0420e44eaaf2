"""What each rank of a run does: build, shard, train and time the workload (`train_rank`).

Runs inside a launched rank (`worker.py`), with the torch.distributed environment set. A hook
(`TrainConfig.hook`) sees a `RankContext` and is called around every step. A plan with splits
shards the split model (`Plan.apply`) and its batches pass through the plan's batch transform.
"""

from __future__ import annotations

import importlib
import itertools
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from sparselift.workloads.harness import RankResult, TrainConfig
from sparselift.workloads.spec import WorkloadSpec, load_workload

AHEAD_BYTES = 1 << 30  # at most this much of a run's batches is made before its first step
PIPELINE_DEPTH = 2  # batches a train pipeline takes beyond the one it steps on


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
    plan_file: str | None  # the plan's path; None: TorchRec's planner
    contender: int = 0  # its index in `cfg.contenders` (a side-by-side job); 0 in a plain one


class StepHook(Protocol):
    """What a hook factory returns: called around every step, then once at the end."""

    def step_begin(self, step: int) -> None:
        """Before step `step` (0-based, warm-up included)."""

    def step_end(self, step: int) -> None:
        """After step `step` has finished (CUDA synchronized)."""

    def finish(self) -> dict[str, Any]:
        """After the last step; a JSON-able dict that becomes `RankResult.extra`."""
        ...


def load_hook(cfg: TrainConfig, ctx: RankContext) -> StepHook | None:
    """The hook of a run: `cfg.hook` ("module:factory") called with `ctx` and `cfg.hook_args`.

    Returns None when the run has no hook.
    """
    if not cfg.hook:
        return None
    module, _, name = cfg.hook.partition(":")
    return getattr(importlib.import_module(module), name)(ctx, **cfg.hook_args)


def peak_memory_bytes(device: Any) -> int:
    """Peak device memory on CUDA; peak resident set size of the process on CPU."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def batches_for_rank(
    cfg: TrainConfig, spec: WorkloadSpec, rank: int, world_size: int
) -> Iterator[Any]:
    """The endless batch stream of `rank`: Criteo day files if `cfg.data`, else synthetic.

    Args:
        cfg: the run (data directory, batch size, seed, max_rows).
        spec: the workload, uncapped (synthetic ids follow the real sizes, then are hashed).
        rank: this rank.
        world_size: ranks (Criteo days are split among them).
    """
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
    """The stream, its first `n` batches made now, before the timed loop.

    TorchRec's own benchmarks do the same: a trainer's data loader runs beside the step, so a step
    should time training, not the synthesis (or file reading) of its batch. Past `budget` bytes
    the rest of the stream comes as needed.
    """
    first, size = [], 0
    for b in itertools.islice(batches, n):
        first.append(b)
        kjt = b.sparse_features
        size += sum(t.nbytes for t in (kjt.values(), kjt.lengths(), b.dense_features, b.labels))
        if size >= budget:
            break
    return itertools.chain(first, batches)


@dataclass
class RankSetup:
    """This rank of the job, its process group started: who it is and where it trains."""

    rank: int
    world_size: int
    local_world_size: int
    device: Any  # torch.device
    backend: str
    spec: WorkloadSpec  # uncapped: synthetic ids follow the real sizes
    trained: WorkloadSpec  # capped by max_rows: the tables as trained


def init_rank(cfg: TrainConfig) -> RankSetup:
    """Start this rank's process group (gloo on CPU, NCCL on CUDA) from the torch.distributed
    env variables."""
    import torch
    import torch.distributed as dist

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
    spec = load_workload(cfg.workload)
    return RankSetup(rank, world, local_world, device, backend, spec, spec.capped(cfg.max_rows))


@dataclass
class Trainee:
    """One sharded model of the job, ready to step: its context, hook and batch stream."""

    ctx: RankContext
    hook: StepHook | None
    batches: Iterator[Any]
    pipeline_name: str

    def step(self, step: int) -> float:
        """Run step `step` (hook around it); its seconds (CUDA synchronized)."""
        if self.hook:
            self.hook.step_begin(step)
        t0 = time.perf_counter()
        self.ctx.pipeline.progress(self.batches)
        if self.ctx.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.ctx.device)
        seconds = time.perf_counter() - t0
        if self.hook:
            self.hook.step_end(step)
        return seconds


def build_trainee(
    cfg: TrainConfig, setup: RankSetup, plan_file: str | None, steps: int, contender: int = 0
) -> Trainee:
    """Shard the workload by `plan_file` (None: TorchRec's planner), build its optimizer, train
    pipeline, hook and the stream of its `steps` batches (made ahead; seeded by `cfg.seed`, so
    every trainee of a job gets the same model and the same batches). `contender` is its index in
    a side-by-side job (the hook sees it in `RankContext.contender`).
    """
    import torch
    import torch.distributed as dist

    from sparselift.workloads.sharding import build_optimizer, make_pipeline, shard

    plan = None
    if plan_file:
        from sparselift import plans

        plan = plans.load(plan_file)
    torch.manual_seed(cfg.seed)
    model = shard(
        setup.trained,
        dist.GroupMember.WORLD,
        setup.device,
        plan=plan,
        local_world_size=setup.local_world_size,
    )
    optimizer = build_optimizer(model)
    pipeline_name = cfg.pipeline or (plan.pipeline if plan is not None else "base")
    pipeline = make_pipeline(pipeline_name, model, optimizer, setup.device)
    ctx = RankContext(
        cfg=cfg,
        spec=setup.trained,
        rank=setup.rank,
        world_size=setup.world_size,
        local_world_size=setup.local_world_size,
        device=setup.device,
        backend=setup.backend,
        model=model,
        pipeline=pipeline,
        plan=plan,
        plan_file=plan_file,
        contender=contender,
    )
    hook = load_hook(cfg, ctx)
    stream = batches_for_rank(cfg, setup.spec, setup.rank, setup.world_size)
    batches = made_ahead(stream, steps + PIPELINE_DEPTH)
    if plan is not None and plan.splits:
        # the split model takes each batch with its split features on their virtual tables;
        # transformed as drawn, inside the step, as a trainer's loader in the main process does
        batches = plan.transform_loader(batches)
    return Trainee(ctx, hook, batches, pipeline_name)


def train_rank(cfg: TrainConfig) -> RankResult:
    """One rank of the job: build, shard, train, time. Needs the torch.distributed env variables."""
    import torch.distributed as dist

    setup = init_rank(cfg)
    total = cfg.warmup + cfg.steps
    trainee = build_trainee(cfg, setup, cfg.plan, total)
    times = []
    every = max(1, total // 10)
    for step in range(total):
        times.append(trainee.step(step))
        if cfg.progress and setup.rank == 0 and ((step + 1) % every == 0 or step + 1 == total):
            phase = "warm-up" if step < cfg.warmup else "measured"
            print(f"  step {step + 1}/{total} ({phase}) {times[-1] * 1e3:.1f} ms", flush=True)
    extra = trainee.hook.finish() if trainee.hook else {}
    dist.barrier()
    return RankResult(
        rank=setup.rank,
        step_times_s=times,
        peak_memory_bytes=peak_memory_bytes(setup.device),
        pipeline=trainee.pipeline_name,
        device=setup.device.type,
        backend=setup.backend,
        extra=extra,
    )
