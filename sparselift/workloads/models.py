"""Model builders: TorchRec's DLRM and DLRM-DCN, and a concat-MLP model for mixed embedding dims.

Every builder returns a module whose forward takes a `torchrec.datasets.utils.Batch` and returns
`(loss, (loss, logits, labels))` — the contract TorchRec's train pipelines expect. Embedding tables
are created on the `meta` device so that DistributedModelParallel materializes only each rank's
shards.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sparselift.workloads.spec import WorkloadSpec

META = torch.device("meta")


def table_configs(spec: WorkloadSpec) -> list[EmbeddingBagConfig]:
    """TorchRec's EmbeddingBagConfig of every table of `spec`, in table order."""
    return [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=list(t.features),
        )
        for t in spec.tables
    ]


class ConcatMLP(nn.Module):
    """Pooled embeddings of any dims concatenated with the dense tower's output, then an MLP."""

    def __init__(
        self,
        ebc: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch: list[int],
        over_arch: list[int],
        dense_device: torch.device | None = None,
    ) -> None:
        """The model over `ebc`: dense tower `dense_arch`, then `over_arch` (ending in 1 logit)."""
        super().__init__()
        self.embedding_bag_collection = ebc
        self.dense_arch = MLP(dense_in_features, dense_arch, device=dense_device)
        pooled_dim = sum(
            c.embedding_dim * len(c.feature_names) for c in ebc.embedding_bag_configs()
        )
        self.over_arch = nn.Sequential(
            MLP(dense_arch[-1] + pooled_dim, list(over_arch[:-1]), device=dense_device)
            if len(over_arch) > 1
            else nn.Identity(),
            nn.Linear(
                over_arch[-2] if len(over_arch) > 1 else dense_arch[-1] + pooled_dim,
                over_arch[-1],
                device=dense_device,
            ),
        )

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        """Logits, one per sample."""
        pooled = self.embedding_bag_collection(sparse_features).values()
        return self.over_arch(torch.cat([self.dense_arch(dense_features), pooled], dim=1))


def build_model(
    spec: WorkloadSpec,
    dense_device: torch.device | None = None,
    embedding_device: torch.device = META,
) -> DLRMTrain:
    """The train module (loss + logits) for `spec`.

    Args:
        spec: the workload.
        dense_device: where the dense layers live (None: torch's default device).
        embedding_device: where the tables live: `meta` (default) for DistributedModelParallel
            to materialize only each rank's shards; a real device for unsharded use.
    """
    ebc = EmbeddingBagCollection(tables=table_configs(spec), device=embedding_device)
    arch = spec.model
    dlrm_args: dict[str, Any] = dict(
        dense_in_features=spec.dense_in_features,
        dense_arch_layer_sizes=list(arch.dense_arch),
        over_arch_layer_sizes=list(arch.over_arch),
        dense_device=dense_device,
    )
    if arch.arch == "dlrm":
        core: nn.Module = DLRM(ebc, **dlrm_args)
    elif arch.arch == "dlrm-dcn":
        core = DLRM_DCN(
            ebc,
            dcn_num_layers=arch.dcn_num_layers,
            dcn_low_rank_dim=arch.dcn_low_rank_dim,
            **dlrm_args,
        )
    else:
        core = ConcatMLP(
            ebc, spec.dense_in_features, list(arch.dense_arch), list(arch.over_arch), dense_device
        )
    # DLRMTrain only needs `model(dense, sparse) -> logits`, which ConcatMLP provides too.
    return DLRMTrain(core)
