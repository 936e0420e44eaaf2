"""The batch transform of a plan with splits: each feature's ids → its virtual tables' features.

A split model's EmbeddingBagCollection is fed virtual features (`splits.virtual_feature`), so
the transform runs in the data path, before TorchRec's input distribution; the train pipelines
(TrainPipelineSparseDist too) then distribute the transformed batch as any other. Ids keep their
order within each bag, so pooling sums the same ids.

- hot_cold: an id in the hot set goes to the hot part as its row there; every other id goes to
  the cold part unchanged (the cold part keeps the table's row numbering).
- row_ranges: an id in range i goes to part i, less the range's start.
- column_slices: every id goes to every part unchanged.

Its cost must not grow with the number of split features: the ids are routed in a few groups,
each with a fixed number of vectorized ops over all of its ids (`routing`; a lookup-table group
adds one small gather a feature, a two-part row-range group one comparison a feature), and the
output is one buffer that each block is written into, in output order (a two-part group's ids
scattered straight there: `partition`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

import torch

from sparselift.plans.errors import PlanError
from sparselift.plans.partition import Partition, partition
from sparselift.plans.routing import (
    COLUMNS,
    LOOKUP,
    RANGES_2,
    ROUTED,
    Group,
    Stream,
    Tables,
    any_outside,
    bucketed,
    build_tables,
    id_codes,
    layout,
    looked_up,
    merge_blocks,
    per_id,
    slices,
)
from sparselift.plans.splits import sharded_tables
from sparselift.plans.types import Split, TableFingerprint


@dataclasses.dataclass
class _Program:
    """How the output is built from one input key order (cached per order)."""

    groups: list[Group]
    blocks: list[tuple[int, int, int]]  # output order: (stream, first, end) of its features
    checked: list[tuple[int, str, str, int]]  # (input index, feature, table, rows), model order


class BatchTransform:
    """Maps a KeyedJaggedTensor of the model's features to the split model's virtual features.

    Output keys: the virtual features in the order of the tables as sharded (model order, a
    split table's parts in its place, part by part), then any input feature the plan does not
    name, in input order. Weighted KJTs carry their weights along with the ids; values, lengths
    and weights keep their dtypes.
    """

    def __init__(self, model: list[TableFingerprint], splits: list[Split], source: str) -> None:
        """Prepare the transform for `splits` of `model`'s tables (`source` names the plan)."""
        self.source = source
        self.splits = {s.table: s for s in splits}
        self.model = model
        self.keys = [f for t in sharded_tables(model, splits) for f in t.feature_names]
        self._table_of = {f: t for t in model for f in t.feature_names}
        self._layout = layout(model, self.splits)
        self._tables: dict[tuple[str, str, str], Tables] = {}
        self._programs: dict[tuple[str, ...], _Program] = {}
        # the profiler's, while it times the transform in the steps: called with each batch's
        # seconds, split features and ids they route (none otherwise)
        self.timer: Callable[[float, int, int], None] | None = None

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
        t0 = time.perf_counter() if self.timer is not None else 0.0
        keys = list(kjt.keys())
        prog = self._program(tuple(keys))
        stride = kjt.stride()
        values, lengths, weights = kjt.values(), kjt.lengths(), kjt.weights_or_none()
        sizes = kjt.length_per_key()
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        routes: list[Stream | Partition] = [Stream(values, weights, lengths, offsets)]
        tables = self._device_tables(values.device, values.dtype)
        for g in prog.groups:
            wts = None
            if weights is not None:
                wts = slices(weights, [(offsets[x], offsets[y]) for x, y in g.runs])
            g_sizes = [sizes[i] for i in g.features]
            # a CPU gather checks its indices itself (`looked_up`); a CUDA one asserts instead
            gather_checks = g.kind == LOOKUP and values.device.type == "cpu"
            if not gather_checks:
                ids = slices(values, [(offsets[x], offsets[y]) for x, y in g.runs])
                if any_outside(ids, g_sizes, g.rows1):
                    self._raise_outside(prog, values, offsets)
                if g.kind == COLUMNS:
                    continue
            lens = slices(lengths, [(x * stride, y * stride) for x, y in g.runs])
            n_feat = len(g_sizes)
            if g.kind == RANGES_2:  # part: at or past the boundary; placed, less the boundary
                part = torch.empty(ids.numel(), dtype=torch.int32, device=ids.device)
                at = 0
                for b, n in zip(g.params, g_sizes, strict=True):
                    torch.ge(ids[at : at + n], b, out=part[at : at + n])
                    at += n
                shift = [0] * n_feat + list(g.params)
                routes.append(partition(part, ids, wts, lens, n_feat, stride, shift))
                continue
            if g.kind == LOOKUP:
                feature_ids = [values[offsets[i] : offsets[i + 1]] for i in g.features]
                codes = looked_up(g, tables.lut, feature_ids)
                if codes is None:
                    self._raise_outside(prog, values, offsets)
            else:
                codes = id_codes(g, tables, ids, per_id(g.params, g_sizes, ids))
            if g.n_parts == 2:  # code = 2 × row + part
                part = codes & 1
                placed = codes.to(values.dtype).bitwise_right_shift_(1)  # codes: ours to reuse
                shift = [0] * (2 * n_feat)
                routes.append(partition(part, placed, wts, lens, n_feat, stride, shift))
            else:
                routes.append(bucketed(codes, g.n_parts, lens, wts, n_feat, stride))
        out = KeyedJaggedTensor(
            keys=self._out_keys(keys),
            stride=stride,
            **_assembled(routes, prog.blocks, values, weights, stride),
        )
        if self.timer is not None:
            routed = [i for g in prog.groups if g.kind in ROUTED for i in g.features]
            seconds = time.perf_counter() - t0
            self.timer(seconds, len(routed), sum(sizes[i] for i in routed))
        return out

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

    def loader(self, batches: Iterable[Any], ahead: int = 0) -> Iterator[Any]:
        """The batches of `batches`, each transformed (`batch`).

        Args:
            batches: any iterable of batches (drawn in the caller's thread, in order).
            ahead: 0: each batch is transformed as it is drawn. N > 0: up to N batches are
                transformed ahead, in one background thread, while the trainer runs its step
                (torch ops release the GIL, so the transform can use a core the step leaves
                idle, e.g. while it waits on a collective).
        Raises:
            PlanError: as `batch`, when the batch that failed is drawn (not earlier).
        """
        if ahead <= 0:
            for b in batches:
                yield self.batch(b)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="sparselift-transform") as pool:
            pending: deque[Future[Any]] = deque()
            for b in batches:
                pending.append(pool.submit(self.batch, b))
                if len(pending) > ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    # ----------------------------------------------------------------------------- internals

    def _program(self, keys: tuple[str, ...]) -> _Program:
        """How to build the output from input keys `keys` (cached per key order)."""
        prog = self._programs.get(keys)
        if prog is not None:
            return prog
        index = {k: i for i, k in enumerate(keys)}
        missing = [f for t in self.model for f in t.feature_names if f not in index]
        if missing:
            shown = ", ".join(f"{f!r} (table {self._table_of[f].name!r})" for f in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise PlanError(self.source, f"the batch lacks feature {shown}{more} of the plan")
        by_kind: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            t = self._table_of.get(k)
            if t is not None and t.name in self._layout.kind:
                by_kind.setdefault(self._layout.kind[t.name], []).append(i)
        groups: list[Group] = []
        stream = 1  # stream 0: the input as it is
        for kind in (*ROUTED, COLUMNS):
            feats = by_kind.get(kind, [])
            if not feats:
                continue
            tabs = [self._table_of[keys[i]] for i in feats]
            g = Group(
                kind=kind,
                features=feats,
                runs=[(a, b) for _, a, b in merge_blocks([(0, i) for i in feats])],
                params=[self._layout.param[t.name] for t in tabs],
                rows1=[t.num_embeddings - 1 for t in tabs],
                n_parts=self._layout.n_parts[kind],
                stream=stream,
            )
            stream += 1 if kind in ROUTED else 0
            groups.append(g)
        where = {i: (g, k) for g in groups for k, i in enumerate(g.features)}
        blocks: list[tuple[int, int]] = []
        for t in self.model:
            s = self.splits.get(t.name)
            if s is None:
                blocks += [(0, index[f]) for f in t.feature_names]
                continue
            for p in range(len(s.parts)):
                for f in t.feature_names:
                    g, m = where[index[f]]
                    blocks.append(
                        (0, index[f]) if g.kind == COLUMNS else (g.stream, p * len(g.features) + m)
                    )
        blocks += [(0, index[k]) for k in keys if k not in self._table_of]
        checked = [
            (index[f], f, t.name, t.num_embeddings)
            for t in self.model
            if t.name in self.splits
            for f in t.feature_names
        ]
        prog = _Program(groups=groups, blocks=merge_blocks(blocks), checked=checked)
        self._programs[keys] = prog
        return prog

    def _device_tables(self, device: torch.device, dtype: torch.dtype) -> Tables:
        key = (device.type, str(device.index), str(dtype))
        tables = self._tables.get(key)
        if tables is None:
            tables = build_tables(self.model, self.splits, self._layout)
            moved = {f.name: getattr(tables, f.name).to(device) for f in dataclasses.fields(tables)}
            tables = Tables(**moved)
            self._tables[key] = tables
        return tables

    def _out_keys(self, keys: list[str]) -> list[str]:
        named = self._table_of
        return self.keys + [k for k in keys if k not in named]

    def _raise_outside(self, prog: _Program, values: torch.Tensor, offsets: list[int]) -> NoReturn:
        """Raise for the first split feature, in model order, with ids outside its table."""
        for i, feature, table, rows in prog.checked:
            vals = values[offsets[i] : offsets[i + 1]]
            bad = vals[(vals < 0) | (vals >= rows)]
            if bad.numel():
                raise PlanError(
                    self.source,
                    f"feature {feature!r} of split table {table!r} has ids "
                    f"{int(bad.min())}..{int(bad.max())} outside the table's rows 0..{rows - 1}",
                )
        raise AssertionError("called for a batch with no id outside its table")


def _assembled(
    routes: list[Stream | Partition],
    blocks: list[tuple[int, int, int]],
    values: torch.Tensor,
    weights: torch.Tensor | None,
    stride: int,
) -> dict[str, torch.Tensor | None]:
    """The output's values, lengths and weights, blocks (route, first member, end member) in
    output order, in the input's dtypes: one buffer, a whole two-part group's stream scattered
    straight into its place, the blocks between concatenated into theirs."""
    spans = [routes[r].prefix[b] - routes[r].prefix[a] for r, a, b in blocks]
    out_v = values.new_empty(sum(spans))
    out_w = None if weights is None else weights.new_empty(sum(spans))
    v_run: list[torch.Tensor] = []
    w_run: list[torch.Tensor] = []
    lens, start, at = [], 0, 0

    def flush(end: int) -> None:
        if v_run:
            torch.cat(v_run, out=out_v[start:end])
        if w_run and out_w is not None:
            torch.cat(w_run, out=out_w[start:end])
        v_run.clear()
        w_run.clear()

    for (r, a, b), n in zip(blocks, spans, strict=True):
        route = routes[r]
        lens.append(route.counts[a * stride : b * stride])
        if isinstance(route, Partition) and route.whole(a, b):
            flush(at)
            route.place(out_v[at : at + n], None if out_w is None else out_w[at : at + n])
            start = at + n
        else:
            s = route.stream() if isinstance(route, Partition) else route
            v_run.append(s.values[s.prefix[a] : s.prefix[b]])
            if s.weights is not None:
                w_run.append(s.weights[s.prefix[a] : s.prefix[b]])
        at += n
    flush(at)
    lengths = torch.cat(lens) if lens else routes[0].counts[:0]
    return {"values": out_v, "lengths": lengths, "weights": out_w}
