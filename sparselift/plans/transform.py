"""The batch transform of a plan with splits: each feature's ids → its virtual tables' features.

A split model's EmbeddingBagCollection is fed virtual features (`splits.virtual_feature`), so
the transform runs in the data path, before TorchRec's input distribution; the train pipelines
(TrainPipelineSparseDist too) then distribute the transformed batch as any other. Per split
feature it costs a few vectorized torch ops over that feature's ids; the other features are
copied once. Ids keep their order within each bag, so pooling sums the same ids.

- hot_cold: an id in the hot set goes to the hot part as its row there; every other id goes to
  the cold part unchanged (the cold part keeps the table's row numbering).
- row_ranges: an id in range i goes to part i, less the range's start.
- column_slices: every id goes to every part unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from sparselift.plans.errors import PlanError
from sparselift.plans.splits import sharded_tables
from sparselift.plans.types import Split, TableFingerprint

# One feature's ids routed to a split's parts: (values, lengths, weights or None) per part.
Pieces = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]

# Up to this many rows a hot/cold split looks ids up in a table of every row (8 bytes each);
# beyond, in the sorted hot ids (a binary search per id).
LOOKUP_TABLE_MAX_ROWS = 1 << 21


@dataclasses.dataclass
class _Route:
    """How the ids of one feature of a split table reach its parts (tensors on one device)."""

    split: Split
    feature: str
    rows: int
    hot_rows: torch.Tensor | None = None  # hot_cold, lookup table: row → hot row, or -1
    hot_sorted: torch.Tensor | None = None  # hot_cold, binary search: the hot ids, sorted
    hot_order: torch.Tensor | None = None  # … and the hot row of each
    starts: torch.Tensor | None = None  # row_ranges: each range's first row
    bounds: torch.Tensor | None = None  # row_ranges: the ranges' inner boundaries


class BatchTransform:
    """Maps a KeyedJaggedTensor of the model's features to the split model's virtual features.

    Output keys: the virtual features in the order of the tables as sharded (model order, a
    split table's parts in its place, part by part), then any input feature the plan does not
    name, in input order. Weighted KJTs carry their weights along with the ids.
    """

    def __init__(self, model: list[TableFingerprint], splits: list[Split], source: str) -> None:
        """Prepare the transform for `splits` of `model`'s tables (`source` names the plan)."""
        self.source = source
        self.splits = {s.table: s for s in splits}
        self.model = model
        self.keys = [f for t in sharded_tables(model, splits) for f in t.feature_names]
        self._table_of = {f: t for t in model for f in t.feature_names}
        self._routes: dict[tuple[str, str], dict[str, _Route]] = {}
        self._programs: dict[tuple[str, ...], list[tuple[str, Any]]] = {}

    # ------------------------------------------------------------------------------ the verbs

    def __call__(self, kjt: Any) -> Any:
        """The transformed KJT.

        Raises:
            PlanError: the KJT lacks a feature of the plan's model, has a variable batch per
                feature, or a split feature has ids outside its table (named with the range).
        """
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        if kjt.variable_stride_per_key():
            raise PlanError(self.source, "the batch has a variable batch size per feature")
        keys = list(kjt.keys())
        program = self._program(tuple(keys))
        stride = kjt.stride()
        values, lengths, weights = kjt.values(), kjt.lengths(), kjt.weights_or_none()
        offsets = [0]
        for n in kjt.length_per_key():
            offsets.append(offsets[-1] + n)
        routes = self._device_routes(values.device)
        v_out: list[torch.Tensor] = []
        n_out: list[torch.Tensor] = []
        w_out: list[torch.Tensor] = []
        for op, arg in program:
            if op == "copy":  # input features [a, b), unchanged
                a, b = arg
                v_out.append(values[offsets[a] : offsets[b]])
                n_out.append(lengths[a * stride : b * stride])
                if weights is not None:
                    w_out.append(weights[offsets[a] : offsets[b]])
                continue
            table, inputs = arg  # a split table and the input index of each of its features
            per_feature = []
            for i in inputs:
                vals = values[offsets[i] : offsets[i + 1]]
                lens = lengths[i * stride : (i + 1) * stride]
                wts = weights[offsets[i] : offsets[i + 1]] if weights is not None else None
                per_feature.append(self._route(routes[keys[i]], table, vals, lens, wts))
            for part in range(len(self.splits[table].parts)):  # part by part, as `keys`
                for pieces in per_feature:
                    pv, pn, pw = pieces[part]
                    v_out.append(pv)
                    n_out.append(pn)
                    if pw is not None:
                        w_out.append(pw)
        out_keys = self._out_keys(keys)
        return KeyedJaggedTensor(
            keys=out_keys,
            values=torch.cat(v_out) if v_out else values[:0],
            lengths=torch.cat(n_out) if n_out else lengths[:0],
            weights=torch.cat(w_out) if weights is not None and w_out else None,
            stride=stride,
        )

    def batch(self, batch: Any) -> Any:
        """`batch` with its `sparse_features` transformed (a KJT itself is transformed).

        Args:
            batch: a KeyedJaggedTensor, or an object with a `sparse_features` KJT (TorchRec's
                `Batch` and other dataclasses are copied with `dataclasses.replace`).
        Returns:
            A new batch; `batch` is not changed.
        Raises:
            PlanError: as `__call__`, or `batch` has no sparse features.
        """
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        if isinstance(batch, KeyedJaggedTensor):
            return self(batch)
        kjt = getattr(batch, "sparse_features", None)
        if not isinstance(kjt, KeyedJaggedTensor):
            raise PlanError(
                self.source,
                f"cannot transform a {type(batch).__name__}: it has no sparse_features "
                f"KeyedJaggedTensor",
            )
        if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
            return dataclasses.replace(batch, sparse_features=self(kjt))
        out = copy.copy(batch)
        out.sparse_features = self(kjt)
        return out

    def loader(self, batches: Iterable[Any]) -> Iterator[Any]:
        """The batches of `batches`, each transformed (`batch`) as it is drawn."""
        for b in batches:
            yield self.batch(b)

    # ----------------------------------------------------------------------------- internals

    def _program(self, keys: tuple[str, ...]) -> list[tuple[str, Any]]:
        """The steps that build the output from input keys `keys` (cached per key order)."""
        program = self._programs.get(keys)
        if program is not None:
            return program
        index = {k: i for i, k in enumerate(keys)}
        missing = [f for t in self.model for f in t.feature_names if f not in index]
        if missing:
            shown = ", ".join(f"{f!r} (table {self._table_of[f].name!r})" for f in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise PlanError(self.source, f"the batch lacks feature {shown}{more} of the plan")
        steps: list[tuple[str, Any]] = []
        named: set[str] = set()
        for t in self.model:
            named.update(t.feature_names)
            if t.name in self.splits:
                steps.append(("split", (t.name, [index[f] for f in t.feature_names])))
            else:
                steps += [("copy", (index[f], index[f] + 1)) for f in t.feature_names]
        steps += [("copy", (index[k], index[k] + 1)) for k in keys if k not in named]
        program = _merge_copies(steps)
        self._programs[keys] = program
        return program

    def _out_keys(self, keys: list[str]) -> list[str]:
        named = self._table_of
        return self.keys + [k for k in keys if k not in named]

    def _device_routes(self, device: torch.device) -> dict[str, _Route]:
        key = (device.type, str(device.index))
        routes = self._routes.get(key)
        if routes is None:
            routes = {
                f: _make_route(s, f, fp.num_embeddings, device)
                for fp in self.model
                if (s := self.splits.get(fp.name)) is not None
                for f in fp.feature_names
            }
            self._routes[key] = routes
        return routes

    def _route(
        self,
        r: _Route,
        table: str,
        vals: torch.Tensor,
        lens: torch.Tensor,
        wts: torch.Tensor | None,
    ) -> Pieces:
        """One feature's ids as (values, lengths, weights) per part, in part order."""
        self._check_range(r, table, vals)
        s = r.split
        if s.kind == "column_slices":
            return [(vals, lens, wts)] * len(s.parts)
        if s.kind == "hot_cold":
            if r.hot_rows is not None:
                hot_row = torch.index_select(r.hot_rows, 0, vals)
                is_hot = hot_row >= 0
            else:
                assert r.hot_sorted is not None and r.hot_order is not None
                pos = torch.searchsorted(r.hot_sorted, vals.long())
                pos.clamp_(max=len(r.hot_sorted) - 1)
                is_hot = r.hot_sorted[pos] == vals
                hot_row = r.hot_order[pos]
            return _two_parts(is_hot, hot_row.to(vals.dtype), vals, lens, wts)
        assert r.starts is not None and r.bounds is not None
        part = torch.bucketize(vals, r.bounds, right=True)
        shifted = (vals - r.starts[part]).to(vals.dtype)
        if len(s.parts) == 2:
            first = part == 0
            return _two_parts(first, shifted, shifted, lens, wts)
        return _parts_by_sort(part, len(s.parts), shifted, lens, wts)

    def _check_range(self, r: _Route, table: str, vals: torch.Tensor) -> None:
        if vals.numel() == 0:
            return
        lo, hi = torch.aminmax(vals)
        if int(lo) >= 0 and int(hi) < r.rows:
            return
        bad = vals[(vals < 0) | (vals >= r.rows)]
        raise PlanError(
            self.source,
            f"feature {r.feature!r} of split table {table!r} has ids "
            f"{int(bad.min())}..{int(bad.max())} outside the table's rows 0..{r.rows - 1}",
        )


def _bag_counts(mask: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """How many of each bag's ids `mask` selects (bags of `lens` ids, in order)."""
    return torch.segment_reduce(mask.to(torch.float32), "sum", lengths=lens).to(lens.dtype)


def _two_parts(
    first: torch.Tensor,
    first_ids: torch.Tensor,
    other_ids: torch.Tensor,
    lens: torch.Tensor,
    wts: torch.Tensor | None,
) -> Pieces:
    """The ids `first` selects (as `first_ids`) and the others (as `other_ids`), each part's
    bags in order: a few ops whatever the batch."""
    other = ~first
    n_first = _bag_counts(first, lens)
    pick = torch.masked_select
    return [
        (pick(first_ids, first), n_first, pick(wts, first) if wts is not None else None),
        (pick(other_ids, other), lens - n_first, pick(wts, other) if wts is not None else None),
    ]


def _parts_by_sort(
    part: torch.Tensor,
    n_parts: int,
    ids: torch.Tensor,
    lens: torch.Tensor,
    wts: torch.Tensor | None,
) -> Pieces:
    """Ids grouped by `part` (0..n_parts-1) with a stable sort, which keeps each bag's order."""
    order = torch.argsort(part, stable=True)
    sizes = torch.bincount(part, minlength=n_parts).tolist()
    bag = torch.repeat_interleave(torch.arange(len(lens), device=lens.device), lens)
    per_bag = torch.bincount(part * len(lens) + bag, minlength=n_parts * len(lens))
    per_bag = per_bag.view(n_parts, len(lens)).to(lens.dtype)
    values = ids[order].split(sizes)
    weights = wts[order].split(sizes) if wts is not None else [None] * n_parts
    return [(values[p], per_bag[p], weights[p]) for p in range(n_parts)]


def _merge_copies(steps: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Adjacent copies of consecutive input features as one copy (one slice, not several)."""
    out: list[tuple[str, Any]] = []
    for op, arg in steps:
        if op == "copy" and out and out[-1][0] == "copy" and out[-1][1][1] == arg[0]:
            out[-1] = ("copy", (out[-1][1][0], arg[1]))
        else:
            out.append((op, arg))
    return out


def _make_route(s: Split, feature: str, rows: int, device: torch.device) -> _Route:
    r = _Route(split=s, feature=feature, rows=rows)
    if s.kind == "hot_cold":
        hot = torch.tensor(s.hot_ids, dtype=torch.int64)
        if rows <= LOOKUP_TABLE_MAX_ROWS:
            table = torch.full((rows,), -1, dtype=torch.int64)
            table[hot] = torch.arange(len(hot), dtype=torch.int64)
            r.hot_rows = table.to(device)
        else:
            order = torch.argsort(hot)
            r.hot_sorted, r.hot_order = hot[order].to(device), order.to(device)
    elif s.kind == "row_ranges":
        r.starts = torch.tensor([a for a, _ in s.ranges], dtype=torch.int64, device=device)
        r.bounds = torch.tensor([a for a, _ in s.ranges[1:]], dtype=torch.int64, device=device)
    return r
