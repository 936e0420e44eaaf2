"""Checkpoints across the split: the original table layout ↔ the virtual tables, bit for bit.

A checkpoint here is full (unsharded) tensors by their state-dict names, as an unsharded model's
`state_dict()` gives them, or `full_state(dmp)` gathers them from a sharded one:

- model state `{name: tensor}`: a table's weight is `<collection>.embedding_bags.<table>.weight`
  in the original layout and `<collection>.virtual.embedding_bags.<table>.weight` in the split
  model (every table of a collection holding a split table moves under `virtual`);
- optimizer state `{weight name: {state name: tensor}}`, as a KeyedOptimizer's
  `state_dict()["state"]` names it: row-wise Adagrad's `"<table>.momentum1"`, one value per row
  (per row and column block for TorchRec's column-wise tables: blocks one after another).

Conversion only copies values: hot rows are gathered into the hot part and scattered back over
the cold part (which keeps every row), row ranges and column slices are sliced and concatenated.
A column-sliced table's momentum is one block per slice (what TorchRec keeps for a table sharded
column-wise in the same blocks); a one-block momentum loads into every slice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from sparselift.plans.errors import PlanError
from sparselift.plans.types import Split

INNER = "virtual"
EBAGS = "embedding_bags."
MOMENTUM = "momentum1"


def _parse(key: str) -> tuple[str, str, str] | None:
    """(prefix up to `embedding_bags.`, table, rest after the table) of a table's key."""
    at = key.rfind(EBAGS)
    if at < 0 or (at > 0 and key[at - 1] != "."):
        return None
    table, dot, rest = key[at + len(EBAGS) :].partition(".")
    return (key[:at], table, rest) if dot and table else None


def _is_inner(prefix: str) -> bool:
    """Whether a table key's prefix is a stand-in's inner collection (`….virtual.`)."""
    return prefix == f"{INNER}." or prefix.endswith(f".{INNER}.")


def _groups(keys: Any, tables: set[str]) -> set[str]:
    """The collection prefixes that hold one of `tables`."""
    out = set()
    for k in keys:
        p = _parse(k)
        if p is not None and p[1] in tables:
            out.add(p[0])
    return out


In = TypeVar("In")
Out = TypeVar("Out")


@dataclass(frozen=True)
class _Entries(Generic[In, Out]):
    """How one kind of entry crosses a split: a model state's weight (a tensor) or an optimizer
    state's (state name → tensor). `what`: the state in messages; `copy`: an entry that does not
    change; `split` (plan, key, split, entry): its parts' tensors, and `part` (plan, key, part,
    entry): a part's tensor (both raise PlanError on what they cannot convert); `wrap` (table or
    part, tensor): the entry; `cols`: column slices join by column (weights), not by row blocks."""

    what: str
    copy: Callable[[In], Out]
    split: Callable[[Any, str, Split, In], list[torch.Tensor]]
    part: Callable[[Any, str, str, In], torch.Tensor]
    wrap: Callable[[str, torch.Tensor], Out]
    cols: bool


def _to_virtual(plan: Any, state: Mapping[str, In], kind: _Entries[In, Out]) -> dict[str, Out]:
    """`state` in the original layout as the split model's: every table of a collection holding
    a split table moves under `virtual`, a split table's entry becomes its parts' entries."""
    splits = {s.table: s for s in plan.splits}
    rewritten = _groups(state, set(splits))
    out: dict[str, Out] = {}
    for key, value in state.items():
        p = _parse(key)
        if p is None or p[0] not in rewritten:
            out[key] = kind.copy(value)
            continue
        prefix, table, rest = p
        inner = f"{prefix}{INNER}.{EBAGS}"
        s = splits.get(table)
        if s is None:
            out[f"{inner}{table}.{rest}"] = kind.copy(value)
            continue
        for part, v in zip(s.parts, kind.split(plan, key, s, value), strict=True):
            out[f"{inner}{part}.{rest}"] = kind.wrap(part, v)
    return out


def _to_original(plan: Any, state: Mapping[str, In], kind: _Entries[In, Out]) -> dict[str, Out]:
    """The split model's `state` in the original layout (inverse of `_to_virtual`).

    Raises:
        PlanError: a part of a split table is missing.
    """
    splits = {s.table: s for s in plan.splits}
    part_of = {p: s for s in plan.splits for p in s.parts}
    out: dict[str, Out] = {}
    parts: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}
    inner = f"{INNER}."
    for key, value in state.items():
        p = _parse(key)
        if p is None or not _is_inner(p[0]):
            out[key] = kind.copy(value)
            continue
        prefix, table, rest = p[0][: -len(inner)], p[1], p[2]
        s = part_of.get(table)
        if s is None:
            out[f"{prefix}{EBAGS}{table}.{rest}"] = kind.copy(value)
            continue
        parts.setdefault((prefix, s.table, rest), {})[table] = kind.part(plan, key, table, value)
    for (prefix, table, rest), got in parts.items():
        s = splits[table]
        missing = [p for p in s.parts if p not in got]
        if missing:
            raise PlanError(
                plan.source, f"{kind.what} of split table {table!r} lacks part {missing[0]!r}"
            )
        joined = _join_rows(s, [got[p] for p in s.parts], cols=kind.cols)
        out[f"{prefix}{EBAGS}{table}.{rest}"] = kind.wrap(table, joined)
    return out


def _split_weight(plan: Any, key: str, s: Split, value: torch.Tensor) -> list[torch.Tensor]:
    fp = next(t for t in plan.model if t.name == s.table)
    if tuple(value.shape) != (fp.num_embeddings, fp.embedding_dim):
        raise PlanError(
            plan.source,
            f"{key}: table {s.table!r} is {tuple(value.shape)} in the checkpoint, "
            f"({fp.num_embeddings}, {fp.embedding_dim}) in the plan",
        )
    return _split_rows(s, value, axis_cols=True)


def _split_momentum(
    plan: Any, key: str, s: Split, sub: Mapping[str, torch.Tensor]
) -> list[torch.Tensor]:
    momentum = _momentum(plan, key, s.table, sub)
    rows = next(t for t in plan.model if t.name == s.table).num_embeddings
    if s.kind == "column_slices" and momentum.numel() == rows:
        return [momentum.clone() for _ in s.parts]
    if s.kind == "column_slices" and momentum.numel() == rows * len(s.parts):
        return [momentum[i * rows : (i + 1) * rows].clone() for i in range(len(s.parts))]
    if s.kind != "column_slices" and momentum.numel() == rows:
        return _split_rows(s, momentum, axis_cols=False)
    raise PlanError(
        plan.source,
        f"optimizer state {key}: table {s.table!r} has {momentum.numel()} momentum values "
        f"for {rows} rows",
    )


def _momentum(plan: Any, key: str, table: str, sub: Mapping[str, torch.Tensor]) -> torch.Tensor:
    names = list(sub)
    if names != [f"{table}.{MOMENTUM}"]:
        raise PlanError(
            plan.source,
            f"optimizer state {key}: only row-wise Adagrad's {table}.{MOMENTUM} converts across "
            f"a split, found {names}",
        )
    return sub[names[0]]


_WEIGHTS = _Entries[torch.Tensor, torch.Tensor](
    what="state",
    copy=lambda v: v,
    split=_split_weight,
    part=lambda plan, key, part, v: v,
    wrap=lambda name, v: v,
    cols=True,
)
_OPTIMIZER = _Entries[Mapping[str, torch.Tensor], dict[str, torch.Tensor]](
    what="optimizer state",
    copy=dict,
    split=_split_momentum,
    part=_momentum,
    wrap=lambda name, v: {f"{name}.{MOMENTUM}": v},
    cols=False,
)


def to_virtual(plan: Any, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An original-layout model state as the split model's (other keys unchanged).

    Raises:
        PlanError: a split table's weight has another shape than the plan's model says.
    """
    return _to_virtual(plan, state, _WEIGHTS)


def to_original(plan: Any, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The split model's state in the original layout (other keys unchanged).

    Raises:
        PlanError: a part of a split table is missing.
    """
    return _to_original(plan, state, _WEIGHTS)


def optimizer_to_virtual(
    plan: Any, state: Mapping[str, Mapping[str, torch.Tensor]]
) -> dict[str, dict[str, torch.Tensor]]:
    """An original-layout optimizer state as the split model's (see the module docstring).

    Raises:
        PlanError: a split table has state other than row-wise Adagrad's momentum, or of
            another length than its rows (times its column blocks).
    """
    return _to_virtual(plan, state, _OPTIMIZER)


def optimizer_to_original(
    plan: Any, state: Mapping[str, Mapping[str, torch.Tensor]]
) -> dict[str, dict[str, torch.Tensor]]:
    """The split model's optimizer state in the original layout.

    Raises:
        PlanError: a part of a split table is missing, or has other state than its momentum.
    """
    return _to_original(plan, state, _OPTIMIZER)


def _split_rows(s: Split, value: torch.Tensor, axis_cols: bool) -> list[torch.Tensor]:
    """A table's rows (weights, or one value per row) as its parts' (copies)."""
    if s.kind == "hot_cold":
        hot = torch.tensor(s.hot_ids, dtype=torch.int64, device=value.device)
        return [value.index_select(0, hot), value.clone()]
    if s.kind == "row_ranges":
        return [value[a:b].clone() for a, b in s.ranges]
    assert axis_cols, "column slices split weights by column"
    return [value[:, a:b].clone() for a, b in s.ranges]


def _join_rows(s: Split, parts: list[torch.Tensor], cols: bool) -> torch.Tensor:
    """The parts' values as the table's (inverse of `_split_rows`; momentum: `cols` False)."""
    if s.kind == "hot_cold":
        out = parts[1].clone()
        hot = torch.tensor(s.hot_ids, dtype=torch.int64, device=out.device)
        out.index_copy_(0, hot, parts[0])
        return out
    if s.kind == "row_ranges" or not cols:
        return torch.cat(parts, 0)
    return torch.cat(parts, 1)


# ------------------------------------------------------------------- sharded models (DMP)


def _local_pieces(value: Any) -> tuple[list[int], list[tuple[list[int], torch.Tensor]]] | None:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if not isinstance(value, ShardedTensor):
        return None
    pieces = [
        (list(s.metadata.shard_offsets), s.tensor.detach().cpu()) for s in value.local_shards()
    ]
    return list(value.size()), pieces


def _assemble(size: list[int], pieces: list[tuple[list[int], torch.Tensor]]) -> torch.Tensor:
    full = torch.zeros(size, dtype=pieces[0][1].dtype) if pieces else torch.zeros(size)
    for offsets, t in pieces:
        full[tuple(slice(o, o + n) for o, n in zip(offsets, t.shape, strict=True))] = t
    return full


def _gather(local: dict[Any, Any]) -> dict[Any, Any]:
    """Every rank's {key: plain tensor or (global size, local pieces)} merged into full tensors."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    sizes: dict[Any, list[int]] = {}
    pieces: dict[Any, list[tuple[list[int], torch.Tensor]]] = {}
    plain: dict[Any, torch.Tensor] = {}
    for got in everyone:
        for key, v in got.items():
            if isinstance(v, torch.Tensor):
                plain.setdefault(key, v)
            else:
                sizes[key] = v[0]
                pieces.setdefault(key, []).extend(v[1])
    out = dict(plain)
    for key, size in sizes.items():
        out[key] = _assemble(size, pieces[key])
    return out


def full_state(model: Any) -> dict[str, torch.Tensor]:
    """Every entry of a DistributedModelParallel's state dict as a full tensor, on every rank.

    A collective (every rank calls it). Gathers whole tables onto each rank: for conversion,
    not for models that do not fit one host.
    """
    local: dict[Any, Any] = {}
    for key, v in model.state_dict().items():
        pieces = _local_pieces(v)
        local[key] = pieces if pieces is not None else v.detach().cpu()
    return _gather(local)


def full_optimizer_state(optimizer: Any) -> dict[str, dict[str, torch.Tensor]]:
    """A KeyedOptimizer's state (e.g. `dmp.fused_optimizer`) as full tensors, on every rank.

    A collective; a rank that holds no shard of a table contributes nothing for it.
    """
    local: dict[Any, Any] = {}
    for key, sub in optimizer.state_dict()["state"].items():
        for name, v in sub.items():
            if not isinstance(v, torch.Tensor):
                continue
            pieces = _local_pieces(v)
            local[(key, name)] = pieces if pieces is not None else v.detach().cpu()
    out: dict[str, dict[str, torch.Tensor]] = {}
    for (key, name), v in sorted(_gather(local).items()):
        out.setdefault(key, {})[name] = v
    return out


def _check_size(target: Any, full: torch.Tensor, what: str, source: str) -> None:
    size = list(target.size())
    if list(full.shape) != size:
        raise PlanError(source, f"{what}: the checkpoint has {list(full.shape)}, the model {size}")


def _fill(target: Any, full: torch.Tensor, what: str, source: str) -> None:
    """Copy `full` into `target` (a tensor, or a ShardedTensor's local shards)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    _check_size(target, full, what, source)
    with torch.no_grad():
        if isinstance(target, ShardedTensor):
            for s in target.local_shards():
                at = tuple(
                    slice(o, o + n)
                    for o, n in zip(s.metadata.shard_offsets, s.metadata.shard_sizes, strict=True)
                )
                s.tensor.copy_(full[at])
        else:
            target.copy_(full)


def load_full_state(model: Any, state: Mapping[str, torch.Tensor], source: str = "<plan>") -> None:
    """Load full tensors into a DistributedModelParallel: each rank keeps its shards' part.

    Raises:
        PlanError: the state lacks an entry of the model's, or sizes differ (nothing named is
            half-loaded: entries are checked before any is copied).
    """
    sd = model.state_dict()
    missing = [k for k in sd if k not in state]
    if missing:
        raise PlanError(source, f"the checkpoint lacks {missing[0]!r} ({len(missing)} in all)")
    for key, target in sd.items():
        _check_size(target, state[key], key, source)
    for key, target in sd.items():
        _fill(target, state[key].to(_device_of(target)), key, source)
    model.load_state_dict(sd)


def load_full_optimizer_state(
    optimizer: Any, state: Mapping[str, Mapping[str, torch.Tensor]], source: str = "<plan>"
) -> None:
    """Load full optimizer state into a KeyedOptimizer (e.g. `dmp.fused_optimizer`).

    Raises:
        PlanError: the state lacks one the optimizer keeps, or sizes differ.
    """
    osd = optimizer.state_dict()
    for key, sub in osd["state"].items():
        for name, target in sub.items():
            if isinstance(target, torch.Tensor) and name not in state.get(key, {}):
                raise PlanError(source, f"the optimizer checkpoint lacks {key} {name}")
    for key, sub in osd["state"].items():
        for name, target in sub.items():
            if isinstance(target, torch.Tensor):
                _fill(target, state[key][name].to(_device_of(target)), f"{key} {name}", source)
    optimizer.load_state_dict(osd)


def _device_of(t: Any) -> torch.device:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(t, ShardedTensor):
        shards = t.local_shards()
        return shards[0].tensor.device if shards else torch.device("cpu")
    return t.device
