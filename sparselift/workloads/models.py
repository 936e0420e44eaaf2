"""Model builders: TorchRec's DLRM and DLRM-DCN, and a concat-MLP model for mixed embedding dims
and sequence tables.

Every builder returns a module whose forward takes a `torchrec.datasets.utils.Batch` and returns
`(loss, (loss, logits, labels))` — the contract TorchRec's train pipelines expect. Embedding tables
are created on the `meta` device so that DistributedModelParallel materializes only each rank's
shards. A spec's sequence tables live in EmbeddingCollections (one embedding per id, as a
sequence model's history features; one collection per dim, as TorchRec's holds tables of one
dim), which only `concat-mlp` has: it averages each sequence feature's embeddings per sample.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from sparselift.workloads.spec import TableSpec, WorkloadSpec, sequence_collection_name

META = torch.device("meta")


def table_configs(spec: WorkloadSpec) -> list[EmbeddingBagConfig]:
    """TorchRec's EmbeddingBagConfig of every pooled (not sequence) table of `spec`, in table
    order."""
    return [_config(EmbeddingBagConfig, t) for t in spec.tables if not t.sequence]


def sequence_configs(spec: WorkloadSpec) -> dict[int, list[EmbeddingConfig]]:
    """TorchRec's EmbeddingConfig of every sequence table of `spec` by embedding dim (sorted),
    each dim's in table order."""
    dims = sorted({t.embedding_dim for t in spec.tables if t.sequence})
    return {
        d: [_config(EmbeddingConfig, t) for t in spec.tables if t.sequence and t.embedding_dim == d]
        for d in dims
    }


def _config(cls: Any, t: TableSpec) -> Any:
    return cls(
        name=t.name,
        embedding_dim=t.embedding_dim,
        num_embeddings=t.num_embeddings,
        feature_names=list(t.features),
        data_type=DataType[t.data_type.upper()],
    )


def sequence_mean(jt: JaggedTensor) -> torch.Tensor:
    """Each sample's mean embedding of a sequence feature (zeros for a sample without ids)."""
    lengths = jt.lengths()
    sample = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    values = jt.values()
    sums = values.new_zeros(lengths.numel(), values.shape[1]).index_add_(0, sample, values)
    return sums / lengths.clamp(min=1).unsqueeze(1).to(values.dtype)


class ConcatMLP(nn.Module):
    """Pooled embeddings of any dims (and each sequence feature's mean embedding) concatenated
    with the dense tower's output, then an MLP."""

    def __init__(
        self,
        ebc: EmbeddingBagCollection | None,
        dense_in_features: int,
        dense_arch: list[int],
        over_arch: list[int],
        dense_device: torch.device | None = None,
        ecs: dict[str, EmbeddingCollection] | None = None,
    ) -> None:
        """The model over `ebc` and the EmbeddingCollections `ecs` (by name; `ebc` may be None
        where there are some): dense tower `dense_arch`, then `over_arch` (ending in 1 logit)."""
        super().__init__()
        self.embedding_bag_collection = ebc
        self.embedding_collections = nn.ModuleDict(ecs or {})
        self.dense_arch = MLP(dense_in_features, dense_arch, device=dense_device)
        bags = ebc.embedding_bag_configs() if ebc is not None else []
        seqs = [c for ec in (ecs or {}).values() for c in ec.embedding_configs()]
        self._sequence_features = {
            name: [f for c in ec.embedding_configs() for f in c.feature_names]
            for name, ec in (ecs or {}).items()
        }
        pooled_dim = sum(c.embedding_dim * len(c.feature_names) for c in [*bags, *seqs])
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
        parts = [self.dense_arch(dense_features)]
        if self.embedding_bag_collection is not None:
            parts.append(self.embedding_bag_collection(sparse_features).values())
        for name, ec in self.embedding_collections.items():
            per_id = ec(sparse_features)
            parts += [sequence_mean(per_id[f]) for f in self._sequence_features[name]]
        return self.over_arch(torch.cat(parts, dim=1))


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
    bags, seqs = table_configs(spec), sequence_configs(spec)
    ebc = EmbeddingBagCollection(tables=bags, device=embedding_device) if bags else None
    arch = spec.model
    dlrm_args: dict[str, Any] = dict(
        dense_in_features=spec.dense_in_features,
        dense_arch_layer_sizes=list(arch.dense_arch),
        over_arch_layer_sizes=list(arch.over_arch),
        dense_device=dense_device,
    )
    if arch.arch != "concat-mlp":
        assert ebc is not None and not seqs, "the spec's checks keep sequence tables to concat-mlp"
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
        ecs = {
            sequence_collection_name(d): EmbeddingCollection(tables=c, device=embedding_device)
            for d, c in seqs.items()
        }
        core = ConcatMLP(
            ebc,
            spec.dense_in_features,
            list(arch.dense_arch),
            list(arch.over_arch),
            dense_device,
            ecs,
        )
    # DLRMTrain only needs `model(dense, sparse) -> logits`, which ConcatMLP provides too.
    return DLRMTrain(core)
