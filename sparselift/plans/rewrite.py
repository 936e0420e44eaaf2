"""The split model: an EmbeddingBagCollection with split tables becomes `VirtualTables`.

`VirtualTables` stands where the EmbeddingBagCollection stood and behaves like it: fed the
transformed batch (`transform.BatchTransform`), it looks the virtual features up in an inner
EmbeddingBagCollection of the virtual tables (`.virtual`, which DistributedModelParallel shards
like any) and returns the original features' pooled embeddings, in the original order: a row
split's parts summed, a column split's parts concatenated. Its forward is traceable by torch.fx
(the checks and the recombination are wrapped leaf functions, and the inner collection gets the
batch's KJT untouched), so TorchRec's TrainPipelineSparseDist still pipelines the input
distribution of the inner collection.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedTensor

from sparselift.plans.checkpoint import INNER, to_virtual
from sparselift.plans.errors import PlanError
from sparselift.plans.splits import part_fingerprints, virtual_feature
from sparselift.plans.types import Split, TableFingerprint

ROW_SPLITS = ("hot_cold", "row_ranges")  # parts summed: exact only for SUM pooling
# layout: per original feature (key, dim, ((virtual key, first column or -1 to add), ...))
Layout = tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...]


def _refuse_untransformed(keys: Any, virtual: tuple[str, ...], source: str) -> None:
    """PlanError if feature names `keys` lack one of the split tables' virtual features."""
    have = set(keys)
    missing = [k for k in virtual if k not in have]
    if missing:
        feature = missing[0].rsplit("/", 1)[0]
        raise PlanError(
            source,
            f"the batch reaching the split model was not transformed (it has no virtual feature "
            f"{missing[0]!r} of feature {feature!r}): transform each batch with "
            f"plan.transform_batch(batch) or plan.transform_loader(loader)",
        )


@torch.fx.wrap
def _check_virtual_features(features: Any, virtual: tuple[str, ...], source: str) -> None:
    """Refuse a batch that was not transformed: it lacks the split tables' virtual features."""
    _refuse_untransformed(features.keys(), virtual, source)


# A recombination's timer: called with ("forward" or "backward", seconds, pooled elements read
# from split tables' parts, pooled elements written).
RecombineTimer = Callable[[str, float, int, int], None]


@torch.fx.wrap
def _recombine(pooled: Any, layout: Layout, timer: RecombineTimer | None = None) -> KeyedTensor:
    """The original features' pooled embeddings from the virtual features' ones.

    Each output feature is one virtual feature (unsplit), its column slices concatenated in
    order, or the sum of its row parts in part order (the parts' bags partition the bag). The
    blocks are views of the pooled values, so backward splits the gradient without a dense
    zero-fill and scatter. `timer` (the profiler's) hears how long forward and backward took.
    """
    values = pooled.values()  # waits for a LazyAwaitable
    t0 = time.perf_counter() if timer is not None else 0.0
    blocks = dict(zip(pooled.keys(), values.split(pooled.length_per_key(), dim=1), strict=True))
    outs: list[torch.Tensor] = []
    for _, _, parts in layout:
        if parts[0][1] >= 0:  # column slices, in column order: concatenated
            outs += [blocks[vkey] for vkey, _ in parts]
        else:  # unsplit, or row parts summed in part order
            x = blocks[parts[0][0]]
            for vkey, _ in parts[1:]:
                x = x + blocks[vkey]
            outs.append(x)
    out = torch.cat(outs, dim=1)
    if timer is not None:
        _time_recombine(timer, t0, values, out, layout)
    return KeyedTensor(
        keys=[k for k, _, _ in layout], length_per_key=[d for _, d, _ in layout], values=out
    )


def _time_recombine(
    timer: RecombineTimer, t0: float, values: torch.Tensor, out: torch.Tensor, layout: Layout
) -> None:
    """Tell `timer` the forward's seconds since `t0`, and hook the backward's: from the output's
    gradient arriving to the input's being made."""
    rows = values.shape[0]
    # the split features' parts: a row part as wide as its feature, column slices as wide in all
    read = rows * sum(d * (len(p) if p[0][1] < 0 else 1) for _, d, p in layout if len(p) > 1)
    written = rows * out.shape[1]
    timer("forward", time.perf_counter() - t0, read, written)
    if not (out.requires_grad and values.requires_grad):
        return
    began: list[float] = []
    out.register_hook(lambda g: began.append(time.perf_counter()))
    values.register_hook(
        lambda g: (
            timer("backward", time.perf_counter() - began[0], read, written) if began else None
        )
    )


class VirtualTables(nn.Module):
    """An EmbeddingBagCollection's stand-in for a plan with splits (see the module docstring).

    Attributes:
        virtual: the inner EmbeddingBagCollection of the virtual tables (the unsplit tables
            keep their names and features), in the original tables' order.
    """

    def __init__(self, original: EmbeddingBagCollection, splits: dict[str, Split], source: str):
        """Stand in for `original`, its tables split as `splits` says ({table: Split})."""
        super().__init__()
        configs = original.embedding_bag_configs()
        virtual_configs: list[EmbeddingBagConfig] = []
        layout: list[tuple[str, int, tuple[tuple[str, int], ...]]] = []
        for c in configs:
            s = splits.get(c.name)
            if s is None:
                virtual_configs.append(dataclasses.replace(c, feature_names=list(c.feature_names)))
                layout += [(f, c.embedding_dim, ((f, -1),)) for f in c.feature_names]
                continue
            fp = TableFingerprint(c.name, c.num_embeddings, c.embedding_dim, tuple(c.feature_names))
            for part in part_fingerprints(s, fp):
                virtual_configs.append(
                    dataclasses.replace(
                        c,
                        name=part.name,
                        num_embeddings=part.num_embeddings,
                        embedding_dim=part.embedding_dim,
                        feature_names=list(part.feature_names),
                    )
                )
            starts = [a for a, _ in s.ranges] if s.kind == "column_slices" else None
            for f in c.feature_names:
                layout.append(
                    (
                        f,
                        c.embedding_dim,
                        tuple(
                            (virtual_feature(f, p), starts[i] if starts else -1)
                            for i, p in enumerate(s.parts)
                        ),
                    )
                )
        # the inner collection's attribute name is INNER: tables at `<path>.virtual.…`
        self.virtual = EmbeddingBagCollection(
            tables=virtual_configs, is_weighted=original.is_weighted(), device=original.device
        )
        self._configs = configs
        self._layout: Layout = tuple(layout)
        originals = {c.name for c in configs}
        # the split tables' virtual features: what an untransformed batch lacks
        self._check = tuple(
            f for c in virtual_configs if c.name not in originals for f in c.feature_names
        )
        self._source = source
        self._is_weighted = original.is_weighted()
        # the profiler's, while it times the recombination in the steps (none otherwise)
        self.timer: RecombineTimer | None = None

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The original tables, as the collection this module stands for declared them."""
        return self._configs

    def is_weighted(self) -> bool:
        """Whether the collection takes weighted ids."""
        return self._is_weighted

    def forward(self, features: Any) -> KeyedTensor:
        """Pooled embeddings of the original features from a transformed KJT.

        Raises:
            PlanError: `features` was not transformed (it lacks the virtual features).
        """
        _check_virtual_features(features, self._check, self._source)
        return _recombine(self.virtual(features), self._layout, self.timer)


def rewrite_problems(plan: Any, model: nn.Module) -> list[str]:
    """What keeps `plan`'s splits from training exactly like `model` (each names the table).

    A row split's parts are summed, which equals the table's pooling only for SUM; a
    data-parallel part is replicated with its table's fused row-wise Adagrad, so the table must
    train with one (`replicated.rowwise_adagrad_args`).
    """
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

    from sparselift.plans.replicated import rowwise_adagrad_args

    problems = []
    by_table = {s.table: s for s in plan.splits}
    for path, m in model.named_modules():
        if isinstance(m, FeatureProcessedEmbeddingBagCollection):
            problems += [
                f"table {c.name!r} is feature-processed ({path!r} is a "
                "FeatureProcessedEmbeddingBagCollection): its feature processors read the "
                "model's features, so it cannot be split"
                for c in m._embedding_bag_collection.embedding_bag_configs()
                if c.name in by_table
            ]
    dp = {t.name for t in plan.tables if t.sharding_type == "data_parallel"}
    for _, ebc in _collections(model):
        for c in ebc.embedding_bag_configs():
            s = by_table.get(c.name)
            if s is None:
                continue
            if s.kind in ROW_SPLITS and c.pooling != PoolingType.SUM:
                problems.append(
                    f"table {c.name!r} pools by {c.pooling.name}: a {s.kind} split is exact only "
                    f"for SUM pooling (its parts' pooled embeddings are summed)"
                )
            replicated = [p for p in s.parts if p in dp]
            if replicated:
                weight = ebc.embedding_bags[c.name].weight
                _, why = rowwise_adagrad_args(weight)
                if why:
                    problems.append(
                        f"table {c.name!r}: part {replicated[0]!r} is data_parallel, which "
                        f"SparseLift trains with the table's fused row-wise Adagrad, but {why}"
                    )
    return problems


def _collections(model: nn.Module) -> list[tuple[str, EmbeddingBagCollection]]:
    return [(p, m) for p, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]


def rewrite(plan: Any, model: nn.Module) -> nn.Module:
    """`model` with each EmbeddingBagCollection holding a split table replaced by VirtualTables.

    Tables on `meta` stay on `meta`; materialized tables are copied into the virtual tables
    (`checkpoint.to_virtual`). Each virtual table's weight carries its table's in-backward
    optimizer (`apply_optimizer_in_backward`'s attributes), so TorchRec fuses the same one.
    Returns `model` (changed in place) or, when `model` is itself a collection, its stand-in;
    a plan without splits returns `model` unchanged.

    Raises:
        PlanError: `rewrite_problems` (nothing is changed).
    """
    if not plan.splits:
        return model
    problems = rewrite_problems(plan, model)
    if problems:
        raise PlanError(plan.source, problems)
    by_table = {s.table: s for s in plan.splits}
    split_collections = [
        names
        for _, ebc in _collections(model)
        if (names := {c.name for c in ebc.embedding_bag_configs()}) & set(by_table)
    ]
    # the batch transform then requires only these collections' features: a model's other
    # collections may be fed batches of their own (`Plan.batch_transform`)
    plan.__dict__["_transform_tables"] = frozenset().union(*split_collections)
    plan.__dict__.pop("_transform", None)
    for path, ebc in _collections(model):
        names = {c.name for c in ebc.embedding_bag_configs()}
        if not names & set(by_table):
            continue
        stand_in = VirtualTables(ebc, {n: by_table[n] for n in names if n in by_table}, plan.source)
        for c in stand_in.virtual.embedding_bag_configs():
            src = c.name if c.name in names else _source_table(c.name, by_table)
            _copy_optimizer(
                ebc.embedding_bags[src].weight, stand_in.virtual.embedding_bags[c.name].weight
            )
        if ebc.device.type != "meta":
            state = to_virtual(plan, ebc.state_dict())
            stand_in.virtual.load_state_dict(
                {k.removeprefix(f"{INNER}."): v for k, v in state.items()}
            )
        if not path:
            return stand_in
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, stand_in)
    return model


def _source_table(part: str, by_table: dict[str, Split]) -> str:
    for s in by_table.values():
        if part in s.parts:
            return s.table
    raise KeyError(part)


def _copy_optimizer(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Give `dst` the in-backward optimizer `apply_optimizer_in_backward` gave `src`, if any."""
    for attr in ("_optimizer_classes", "_optimizer_kwargs"):
        if hasattr(src, attr):
            value = getattr(src, attr)
            if attr == "_optimizer_kwargs":
                value = [dict(k) for k in value]
            setattr(dst, attr, list(value))


def guard_input_dist(dmp: nn.Module, plan: Any) -> None:
    """Make each sharded stand-in collection refuse an untransformed batch at its first input
    distribution, with `_check_virtual_features`' message.

    The sparse-dist pipeline distributes a batch's input before the model's forward sees it;
    TorchRec sets a sharded collection's input distribution up from the first batch's feature
    names, so that is where a batch that was not transformed is first seen.
    """
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

    parts = {p for s in plan.splits for p in s.parts}
    for _, m in dmp.named_modules():
        if not isinstance(m, ShardedEmbeddingBagCollection):
            continue
        virtual = tuple(
            f for c in m._embedding_bag_configs if c.name in parts for f in c.feature_names
        )
        if virtual:
            m._create_input_dist = _guarded(m._create_input_dist, virtual, plan.source)


def _guarded(create: Any, virtual: tuple[str, ...], source: str) -> Any:
    def _create_input_dist(input_feature_names: list[str], *args: Any, **kwargs: Any) -> Any:
        _refuse_untransformed(input_feature_names, virtual, source)
        return create(input_feature_names, *args, **kwargs)

    return _create_input_dist


recombine = _recombine  # public name: the profiler times the recombination (`recombine_cost`)
