"""A plan → TorchRec objects: ShardingPlan, sharders with qcomm codecs, pipeline, DMP, PlanLoader.

Module paths are found by walking the model for its EmbeddingBagCollections,
EmbeddingCollections and FeatureProcessedEmbeddingBagCollections (whose tables TorchRec's sharder
for them shards at that module, its feature processors with them), never hard-coded: DLRM keeps
its tables at `model.sparse_arch.embedding_bag_collection`, other models elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from torchrec.distributed.embedding_types import ShardingType
from torchrec.distributed.planner.types import Perf, PlanLoader, ShardingOption, Storage
from torchrec.distributed.planner.types import Shard as TorchRecShard
from torchrec.distributed.sharding_plan import placement
from torchrec.distributed.types import (
    CacheParams,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardMetadata,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

from sparselift.plans.checkpoint import INNER
from sparselift.plans.errors import PlanError
from sparselift.plans.types import WEIGHT_BYTES, CommPrecision, TableFingerprint, TablePlan

# a FeatureProcessedEmbeddingBagCollection's own EmbeddingBagCollection (TorchRec's attribute)
FP_INNER = "_embedding_bag_collection"

if TYPE_CHECKING:  # `Plan` calls into this module on first use; importing it would close a circle
    from sparselift.plans.plan import Plan


class ModelTable(NamedTuple):
    """A table found in a model: its collection's module path and the table."""

    path: str
    table: TableFingerprint


def model_tables(model: nn.Module) -> list[ModelTable]:
    """Every table of every EmbeddingBagCollection, EmbeddingCollection and
    FeatureProcessedEmbeddingBagCollection in `model` (at that module, not at its own
    EmbeddingBagCollection), in module then table order.

    In a split model these are the tables as sharded: a stand-in's inner collection of virtual
    tables (`original_tables` gives the tables it stands for).
    """
    return _walk(model, stand_ins=False)


def original_tables(model: nn.Module) -> list[ModelTable]:
    """The model's own tables: as `model_tables`, but a split model's stand-ins (VirtualTables)
    count as the collections they replaced, with their original tables."""
    return _walk(model, stand_ins=True)


def _walk(model: nn.Module, stand_ins: bool) -> list[ModelTable]:
    from sparselift.plans.rewrite import VirtualTables

    out = []
    inner: set[str] = set()  # collections that belong to a module listed already
    for path, m in model.named_modules():
        if path in inner:
            continue
        if stand_ins and isinstance(m, VirtualTables):
            out += [ModelTable(path, _fingerprint(c)) for c in m.embedding_bag_configs()]
            inner.add(f"{path}.{INNER}" if path else INNER)
            continue
        out += [ModelTable(path, table) for table in _tables_of(m)]
        if isinstance(m, FeatureProcessedEmbeddingBagCollection):
            inner.add(f"{path}.{FP_INNER}" if path else FP_INNER)
    return out


def duplicate_problems(found: list[ModelTable]) -> list[str]:
    """One problem per table name that more than one of the model's collections use: a plan
    names its tables, so each name must be one table (TorchRec allows one per module)."""
    paths: dict[str, list[str]] = {}
    for t in found:
        paths.setdefault(t.table.name, []).append(repr(t.path))
    return [
        f"table {name!r} is in {len(p)} collections of the model ({', '.join(p)}): a plan names "
        "its tables, so rename all but one"
        for name, p in paths.items()
        if len(p) > 1
    ]


def _tables_of(m: nn.Module) -> list[TableFingerprint]:
    """The tables of `m` if it is an EmbeddingBagCollection, an EmbeddingCollection or a
    FeatureProcessedEmbeddingBagCollection."""
    if isinstance(m, FeatureProcessedEmbeddingBagCollection):
        m = getattr(m, FP_INNER)
    if isinstance(m, EmbeddingBagCollection):
        return [_fingerprint(c) for c in m.embedding_bag_configs()]
    if isinstance(m, EmbeddingCollection):
        return [_fingerprint(c, sequence=True) for c in m.embedding_configs()]
    return []


def _fingerprint(c: Any, sequence: bool = False) -> TableFingerprint:
    return TableFingerprint(
        name=c.name,
        num_embeddings=c.num_embeddings,
        embedding_dim=c.embedding_dim,
        feature_names=tuple(c.feature_names),
        sequence=sequence,
        data_type=c.data_type.name.lower(),
    )


def _table_paths(plan: Plan, model: nn.Module | None) -> dict[str, str]:
    """Table name → its collection's path: from `model`, else each table's `module` in the plan,
    else the plan's `module` (or ""); the tables of a collection that holds a split live in its
    stand-in's inner collection, `<module>.virtual` (every table, where the plan does not say
    which collection each is in)."""
    if model is None:
        split_tables = {s.table for s in plan.splits}
        replaced = {t.module for t in plan.model if t.name in split_tables}
        out = {}
        for t in plan.sharded_tables():
            path = t.module if t.module is not None else (plan.module or "")
            if plan.splits and (t.module is None or t.module in replaced):
                path = f"{path}.{INNER}" if path else INNER
            out[t.name] = path
        return out
    found = model_tables(model)
    duplicates = duplicate_problems(found)
    if duplicates:
        raise PlanError(plan.source, duplicates)
    paths = {t.table.name: t.path for t in found}
    missing = [t.name for t in plan.tables if t.name not in paths]
    if missing:
        hint = (
            " (a plan with splits needs the split model: plan.rewrite(model), or plan.apply)"
            if plan.splits
            else ""
        )
        raise PlanError(
            plan.source,
            [f"table {n!r} is in the plan but not in the model{hint}" for n in missing],
        )
    return paths


def parameter_sharding(
    t: TablePlan, plan: Plan, device_type: str | None = None
) -> ParameterSharding:
    """TorchRec's ParameterSharding of table `t`, placed on `device_type` (default: the plan's)."""
    device_type = device_type or plan.topology.device
    local = plan.topology.local_world_size
    spec = None
    if t.sharding_type != ShardingType.DATA_PARALLEL.value:
        spec = EnumerableShardingSpec(
            [
                ShardMetadata(
                    shard_offsets=list(s.offsets),
                    shard_sizes=list(s.sizes),
                    placement=placement(device_type, s.rank, local),
                )
                for s in t.shards
            ]
        )
    return ParameterSharding(
        sharding_type=t.sharding_type,
        compute_kernel=t.compute_kernel,
        ranks=list(t.ranks),
        sharding_spec=spec,
        cache_params=CacheParams(load_factor=t.cache_load_factor)
        if t.cache_load_factor is not None
        else None,
    )


def sharding_plan(
    plan: Plan, model: nn.Module | None = None, device_type: str | None = None
) -> ShardingPlan:
    """TorchRec's ShardingPlan: {module path: {table: ParameterSharding}}.

    Args:
        plan: the plan.
        model: the unsharded model whose module paths to use; None: the plan's `module`.
        device_type: the device kind the shards are placed on (default: the plan's).
    Raises:
        PlanError: `model` lacks a table of the plan.
    """
    paths = _table_paths(plan, model)
    modules: dict[str, EmbeddingModuleShardingPlan] = {}
    for t in plan.tables:
        module_plan = modules.setdefault(paths[t.name], EmbeddingModuleShardingPlan())
        module_plan[t.name] = parameter_sharding(t, plan, device_type)
    return ShardingPlan(plan=dict(modules))


def sharders(plan: Plan, device: torch.device | None = None) -> list[Any]:
    """TorchRec's sharder of each kind of collection (`precision_sharders`), with qcomm codecs
    when a collective is not fp32."""
    return precision_sharders(plan.comm_precision, device or torch.device(plan.topology.device))


def default_sharders() -> list[Any]:
    """TorchRec's EmbeddingBagCollection, EmbeddingCollection and
    FeatureProcessedEmbeddingBagCollection sharders, as it makes them."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder

    return [
        EmbeddingBagCollectionSharder(),
        EmbeddingCollectionSharder(),
        FeatureProcessedEmbeddingBagCollectionSharder(),
    ]


def precision_sharders(cp: CommPrecision, device: torch.device) -> list[Any]:
    """The EmbeddingBagCollection sharder (first), the EmbeddingCollection sharder and the
    FeatureProcessedEmbeddingBagCollection sharder whose qcomm codecs run the collectives at
    `cp`."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fbgemm_qcomm_codec import (
        CommType,
        QCommsConfig,
        get_qcomm_codecs_registry,
    )
    from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder

    registry = get_qcomm_codecs_registry(
        QCommsConfig(
            forward_precision=CommType(cp.forward), backward_precision=CommType(cp.backward)
        ),
        device=device,
    )
    return [
        EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry),
        EmbeddingCollectionSharder(qcomm_codecs_registry=registry),
        FeatureProcessedEmbeddingBagCollectionSharder(
            EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)
        ),
    ]


def pipeline_class(name: str) -> type:
    """TorchRec's train pipeline class for a plan's `pipeline` ("base" or "sparse-dist")."""
    from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist

    return {"base": TrainPipelineBase, "sparse-dist": TrainPipelineSparseDist}[name]


def apply(plan: Plan, model: nn.Module, pg: Any, device: torch.device) -> Any:
    """Fail closed: check model, world size and device kind first, then build the DMP model.

    A plan with splits rewrites `model` first (`rewrite.rewrite`: its collections with split
    tables become VirtualTables, in place), trains its data-parallel parts with their tables'
    row-wise Adagrad (`replicated.install`) and refuses untransformed batches at the first
    input distribution (`rewrite.guard_input_dist`).

    Returns:
        The DistributedModelParallel of `model` sharded as planned.
    Raises:
        PlanError: listing every way the plan does not fit `model`, `pg`'s size or `device`.
    """
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from sparselift.plans.replicated import install, replicated_tables
    from sparselift.plans.rewrite import guard_input_dist, rewrite, rewrite_problems

    device = torch.device(device)
    problems = []
    if device.type != plan.topology.device:
        problems.append(f"plan is for {plan.topology.device}, this job runs on {device.type}")
    try:
        plan.check(model, pg.size())
    except PlanError as e:
        problems = e.problems + problems
    if not problems and plan.splits:
        problems = rewrite_problems(plan, model)
    if problems:
        raise PlanError(plan.source, problems)
    model = rewrite(plan, model)
    replicated = replicated_tables(plan, model)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=sharding_plan(plan, model, device.type),
        sharders=sharders(plan, device),
    )
    if plan.splits:
        install(dmp, replicated, pg)
        guard_input_dist(dmp, plan)
    return dmp


class SparseLiftPlanLoader(PlanLoader):
    """Serves a SparseLift plan to `EmbeddingShardingPlanner(plan_loader=...)`.

    TorchRec matches loaded options to its enumerated ones by `storage_hash` (table FQN, sharding
    type, kernel, cache load factor, number of shards) and takes only the shards (sizes, offsets,
    ranks) from us, so a plan whose option TorchRec does not enumerate (e.g. a column split it would
    not make) is refused by the planner.
    """

    def __init__(self, plan: Plan, model: nn.Module | None = None) -> None:
        """Serve `plan`; module paths from `model` if given (PlanError if it lacks a table)."""
        self._plan = plan
        self._paths = _table_paths(plan, model)
        self._fingerprints = {t.name: t for t in plan.sharded_tables()}

    def get_plan_id(self) -> str:
        """The plan's source file, as TorchRec's planner logs it."""
        return self._plan.source

    def plan_context_hash(self) -> str | None:
        """None: TorchRec's context check is not used (`Plan.check` compares the model)."""
        return None  # the plan carries its own fingerprint; check() compares it

    def _storage(self, size: list[int], t: TablePlan) -> Storage:
        """Rough bytes of a shard (weights in its table's type + row-wise optimizer state), for
        planner stats."""
        element = WEIGHT_BYTES.get(self._fingerprints[t.name].data_type, 4.0)
        nbytes = int(size[0] * size[1] * element) + size[0] * 4
        if self._plan.topology.device == "cpu" or t.compute_kernel in ("fused_uvm", "key_value"):
            return Storage(hbm=0, ddr=nbytes)
        if t.compute_kernel == "fused_uvm_caching":  # cache_share is never None for this kernel
            return Storage(hbm=int(nbytes * (t.cache_share or 0.0)), ddr=nbytes)
        return Storage(hbm=nbytes, ddr=0)

    def load(self) -> dict[int, ShardingOption]:
        """One ShardingOption per table, keyed by its `storage_hash` (what TorchRec matches on)."""
        out = {}
        world = self._plan.topology.world_size
        for t in self._plan.tables:
            fp = self._fingerprints[t.name]
            shape = (fp.num_embeddings, fp.embedding_dim)
            if t.sharding_type == ShardingType.DATA_PARALLEL.value:
                blocks = [(list(shape), [0, 0], r) for r in range(world)]
            else:
                blocks = [(list(s.sizes), list(s.offsets), s.rank) for s in t.shards]
            shards = [
                TorchRecShard(
                    size=size,
                    offset=offset,
                    rank=rank,
                    perf=Perf(0.0, 0.0, 0.0, 0.0),
                    storage=self._storage(size, t),
                )
                for size, offset, rank in blocks
            ]
            option = ShardingOption(
                name=t.name,
                tensor=torch.empty(shape, device="meta"),
                module=(self._paths[t.name], nn.Module()),
                input_lengths=[1.0] * len(fp.feature_names),
                batch_size=0,
                sharding_type=t.sharding_type,
                partition_by="",
                compute_kernel=t.compute_kernel,
                shards=shards,
                cache_params=CacheParams(load_factor=t.cache_load_factor)
                if t.cache_load_factor is not None
                else None,
                is_pooled=not fp.sequence,
                feature_names=list(fp.feature_names),
            )
            out[option.storage_hash()] = option
        return out
