"""Sharding, optimizers and train pipelines, the way a TorchRec trainer sets them up.

Embedding tables train with a fused row-wise Adagrad applied in backward (FBGEMM's
EXACT_ROWWISE_ADAGRAD, which runs on CPU and GPU); dense parameters with Adagrad.
Without a plan file the model is sharded by TorchRec's own EmbeddingShardingPlanner for the
real topology — the baseline every SparseLift plan is compared with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from sparselift.workloads.models import build_model
from sparselift.workloads.spec import WorkloadSpec

EMBEDDING_LR = 0.02
DENSE_LR = 0.01


def embedding_modules(model: nn.Module) -> list[EmbeddingBagCollection | EmbeddingCollection]:
    """Every EmbeddingBagCollection and EmbeddingCollection in `model`."""
    return [
        m for m in model.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))
    ]


def shard(
    spec: WorkloadSpec,
    pg: Any,
    device: torch.device,
    plan: Any = None,
    local_world_size: int | None = None,
) -> DistributedModelParallel:
    """Build `spec`'s model and shard it over `pg` on `device`.

    Args:
        spec: the workload as trained (capped).
        pg: the process group.
        device: this rank's device.
        plan: a sparselift Plan; None: TorchRec's planner for the real topology.
        local_world_size: ranks per host (None: all ranks on one host).
    Returns:
        The DistributedModelParallel model, its tables trained by a fused row-wise Adagrad.
    Raises:
        PlanError: `plan` does not fit the model, the group or the device.
    """
    model = build_model(spec, dense_device=device)
    for ebc in embedding_modules(model):
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": EMBEDDING_LR})
    if plan is not None:
        return plan.apply(model, pg=pg, device=device)
    world = pg.size()
    sharders: list[Any] = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    topology = Topology(
        world_size=world, compute_device=device.type, local_world_size=local_world_size or world
    )
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=spec.batch_size)
    sharding_plan = planner.collective_plan(model, sharders, pg)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=sharding_plan,
        sharders=sharders,
    )


def build_optimizer(model: DistributedModelParallel) -> CombinedOptimizer:
    """The fused embedding optimizer plus Adagrad over every dense parameter."""
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=DENSE_LR),
    )
    return CombinedOptimizer([model.fused_optimizer, dense])


def make_pipeline(
    name: str, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> Any:
    """TorchRec's TrainPipelineBase ("base") or TrainPipelineSparseDist ("sparse-dist")."""
    from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist

    cls = {"base": TrainPipelineBase, "sparse-dist": TrainPipelineSparseDist}[name]
    return cls(model, optimizer, device)
