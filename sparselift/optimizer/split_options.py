"""The splits the optimizer may choose for a table, as the virtual tables the cost model prices.

A `SplitOption` is one way to rewrite a model table as virtual tables (plan format 2,
`sparselift.plans.splits`): its parts, each a `TableStats` the cost model prices like any table
(`TableStats.split_of` set, so the batch transform is charged), the sharding types each part may
take, and what the plan file needs (hot ids, ranges). The solver then chooses, per table, no
split or one option, and every part's class and ranks (`Problem.alternatives`).

- hot_cold: the hottest ids covering `HOT_COVERAGES` of the lookups, replicated on every rank
  (data_parallel), the rest a cold table of every row sharded as any table. The hot sets come
  from a profile's measured frequencies (`hot_ids.parquet`), or, for what-if planning, from the
  spec's Zipf law and the generator's id scattering (`hot_cold_from_zipf`).
- row_ranges: equal row blocks, each a table-wise table (ids per block: the measured hot ids
  counted exactly, the other lookups spread evenly over the other rows).
- column_slices: equal column blocks, each a table-wise table looked up with every id.
Row and column parts are table-wise only: what they buy is one table-wise group (one all-to-all
pair) where row-wise or column-wise tables would add their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sparselift import plans
from sparselift.errors import UserError
from sparselift.kernels import zipf_share
from sparselift.optimizer.space import DP, MIN_CW_COLS, TW
from sparselift.optimizer.table_stats import TableStats
from sparselift.plans.splits import part_names, virtual_feature
from sparselift.profiler.hot_ids import HotIds, check_table_size

HOT_COVERAGES = (0.25, 0.5, 0.75, 0.9)  # hot sizes offered: the ids covering these shares
MAX_HOT_ROWS = 65_536  # the largest hot part (rows replicated on every rank)
MAX_HOT_ROW_SHARE = 0.25  # … and at most this share of the table's rows
SPLIT_WAYS = (2, 4)  # row ranges / column slices offered (at most the world size)
MIN_SPLIT_ROWS = 4_096  # no row ranges below this many rows a part


@dataclass(frozen=True)
class SplitOption:
    """One rewrite of a model table as virtual tables, priced part by part.

    Attributes:
        table: the model table.
        kind: "hot_cold", "row_ranges" or "column_slices".
        parts: the virtual tables, in the split's part order.
        sharding_types: per part, the sharding types it may take (empty: any).
        hot_ids: hot_cold: the hot part's rows, hottest first.
        ranges: row_ranges / column_slices: [start, end) per part.
        hot_share: hot_cold: the share of the table's lookups the hot part serves.
        plan_names: the parts' names in a plan file (`plans.splits.part_names`); the parts' own
            names tell the options of one table apart (`split_options` tags them "#i").
    """

    table: str
    kind: str
    parts: tuple[TableStats, ...]
    sharding_types: tuple[tuple[str, ...], ...]
    hot_ids: tuple[int, ...] = ()
    ranges: tuple[tuple[int, int], ...] = ()
    hot_share: float | None = None
    plan_names: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """What the option is, for reports: "hot 50% (1,204 rows)", "4 row ranges", …"""
        if self.kind == "hot_cold":
            return f"hot {100 * (self.hot_share or 0):.0f}% ({len(self.hot_ids):,} rows)"
        return f"{len(self.parts)} {self.kind.replace('_', ' ')}"

    @property
    def part_names(self) -> tuple[str, ...]:
        """The virtual tables' names, in part order."""
        return tuple(p.name for p in self.parts)

    def split(self) -> plans.Split:
        """The plan file's split for this option."""
        return plans.Split(
            table=self.table,
            kind=self.kind,
            parts=self.plan_names or self.part_names,
            hot_ids=self.hot_ids,
            ranges=self.ranges,
        )


def _part(t: TableStats, name: str, rows: int, dim: int, share: float, n: int) -> TableStats:
    """Virtual table `name` of `t`: `rows`×`dim`, `share` of its ids, 1/`n` of its transform
    (and of its output, unless a column slice: its own columns)."""
    return dataclasses.replace(
        t,
        name=name,
        num_embeddings=int(rows),
        embedding_dim=int(dim),
        ids_per_sample=max(t.ids_per_sample * share, 1e-9),
        top1pct_share=None,
        top10pct_share=None,
        feature_names=tuple(virtual_feature(f, name) for f in t.feature_names or (t.name,)),
        split_of=t.name,
        routed_features=len(t.feature_names or (t.name,)) / n,
        output_share=1.0 if dim < t.embedding_dim else 1.0 / n,
    )


def _hot_cold(
    t: TableStats, hot_ids: Sequence[int], share: float, names: Sequence[str] = ()
) -> SplitOption:
    hot_name, cold_name = names or part_names(t.name, "hot_cold")
    k, n = len(hot_ids), t.num_embeddings
    hot = _part(t, hot_name, k, t.embedding_dim, share, 2)
    # the cold part's skew past the hot rows (its UVM cache hit rate), from the table's curve
    f0 = k / n
    rest = max(1.0 - share, 1e-9)

    def tail(frac: float) -> float:
        return min(1.0, max(0.0, (t.hot_share(f0 + frac) - t.hot_share(f0)) / rest))

    cold = dataclasses.replace(
        _part(t, cold_name, n, t.embedding_dim, 1.0 - share, 2),
        top1pct_share=tail(0.01),
        top10pct_share=tail(0.1),
        head_rows=k,
        head_share=share,
    )
    return SplitOption(
        table=t.name,
        kind="hot_cold",
        parts=(hot, cold),
        sharding_types=((DP,), ()),
        hot_ids=tuple(int(x) for x in hot_ids),
        hot_share=share,
    )


def _hot_size_ok(k: int, rows: int) -> bool:
    return 0 < k <= min(MAX_HOT_ROWS, MAX_HOT_ROW_SHARE * rows)


def hot_cold_options(t: TableStats, hot: HotIds) -> list[SplitOption]:
    """The hot/cold splits of `t` at the measured hot sizes covering `HOT_COVERAGES`.

    Raises:
        UserError: the hot ids were recorded for another size of the table (stale profile).
    """
    check_table_size(hot, t.name, t.num_embeddings)
    out, seen = [], set()
    for cov in HOT_COVERAGES:
        k = hot.ids_covering(cov)
        if k is None or not _hot_size_ok(k, t.num_embeddings) or k in seen:
            continue
        seen.add(k)
        out.append(_hot_cold(t, hot.ids[:k].tolist(), hot.covered_share(k)))
    return out


def hot_cold_from_zipf(t: TableStats, hottest: Sequence[int]) -> list[SplitOption]:
    """What-if hot/cold splits of `t` from its Zipf law: the hot sizes whose expected share
    reaches `HOT_COVERAGES`, their ids the first of `hottest` (the generator's hottest ids,
    hottest first)."""
    out, seen = [], set()
    n = t.num_embeddings
    for cov in HOT_COVERAGES:
        k = _zipf_rows_covering(t, cov)
        if k is None or not _hot_size_ok(k, n) or k in seen or k > len(hottest):
            continue
        seen.add(k)
        out.append(_hot_cold(t, hottest[:k], zipf_share(n, t.zipf_alpha, k / n)))
    return out


def _zipf_rows_covering(t: TableStats, share: float) -> int | None:
    """The fewest hottest rows whose expected share of lookups reaches `share` (bisection)."""
    n = t.num_embeddings
    if t.zipf_alpha <= 0 or zipf_share(n, t.zipf_alpha, 1.0) < share:
        return None
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        if zipf_share(n, t.zipf_alpha, mid / n) >= share:
            hi = mid
        else:
            lo = mid + 1
    return lo


def row_range_options(t: TableStats, world: int, hot: HotIds | None = None) -> list[SplitOption]:
    """`t` split into equal row ranges, each a table-wise table (`SPLIT_WAYS` up to `world`).

    Each range's share of the lookups counts the measured hot ids in it exactly and spreads the
    other lookups evenly over the other rows (without hot ids: evenly over all rows, as the
    generator scatters ids).
    """
    out = []
    n = t.num_embeddings
    for ways in SPLIT_WAYS:
        if ways > world or n // ways < MIN_SPLIT_ROWS:
            continue
        bounds = [n * i // ways for i in range(ways + 1)]
        ranges = tuple(zip(bounds, bounds[1:], strict=False))
        out.append(_row_ranges(t, ranges, part_names(t.name, "row_ranges", ways), hot))
    return out


def _row_ranges(
    t: TableStats, ranges: tuple[tuple[int, int], ...], names: Sequence[str], hot: HotIds | None
) -> SplitOption:
    shares = _range_shares(ranges, t.num_embeddings, hot)
    parts = tuple(
        _part(t, name, b - a, t.embedding_dim, share, len(ranges))
        for name, (a, b), share in zip(names, ranges, shares, strict=True)
    )
    return SplitOption(t.name, "row_ranges", parts, ((TW,),) * len(parts), ranges=ranges)


def _range_shares(ranges: Sequence[tuple[int, int]], rows: int, hot: HotIds | None) -> list[float]:
    if hot is None or hot.lookups <= 0:
        return [(b - a) / rows for a, b in ranges]
    ids = hot.ids
    other_lookups = max(hot.lookups - hot.kept_lookups, 0)
    other_rows = max(rows - ids.size, 1)
    out = []
    for a, b in ranges:
        inside = (ids >= a) & (ids < b)
        counted = int(hot.counts[inside].sum())
        spread = other_lookups * ((b - a) - int(np.count_nonzero(inside))) / other_rows
        out.append((counted + spread) / hot.lookups)
    return out


def column_slice_options(t: TableStats, world: int) -> list[SplitOption]:
    """`t` split into equal column slices, each a table-wise table looked up with every id
    (`SPLIT_WAYS` up to `world`, slices of a multiple of 4 columns, at least `MIN_CW_COLS`)."""
    out = []
    d = t.embedding_dim
    for ways in SPLIT_WAYS:
        cols = d // ways
        if ways > world or d % ways or cols % 4 or cols < MIN_CW_COLS:
            continue
        ranges = tuple((i * cols, (i + 1) * cols) for i in range(ways))
        out.append(_column_slices(t, ranges, part_names(t.name, "column_slices", ways)))
    return out


def _column_slices(
    t: TableStats, ranges: tuple[tuple[int, int], ...], names: Sequence[str]
) -> SplitOption:
    parts = tuple(
        _part(t, name, t.num_embeddings, b - a, 1.0, len(ranges))
        for name, (a, b) in zip(names, ranges, strict=True)
    )
    return SplitOption(t.name, "column_slices", parts, ((TW,),) * len(parts), ranges=ranges)


def split_options(
    stats: Sequence[TableStats],
    world: int,
    hot: dict[str, HotIds] | None = None,
    hottest: dict[str, Sequence[int]] | None = None,
) -> dict[str, list[SplitOption]]:
    """Every split offered for each table (tables with none are left out; an EmbeddingCollection's
    or a FeatureProcessedEmbeddingBagCollection's table has none: the split model stands in for
    plain EmbeddingBagCollections only).

    Args:
        stats: the model's tables.
        world: ranks (a single rank has nothing to split for).
        hot: measured hot ids per table (a profile's); hot/cold splits from them.
        hottest: what-if: the generator's hottest ids per table, hottest first; hot/cold splits
            from each table's Zipf law (only where `hot` has none for it).
    Returns:
        Per table name, its options: hot/cold first (smallest hot set first), then row ranges,
        then column slices.
    Raises:
        UserError: a table's hot ids were recorded for another table size.
    """
    if world < 2:
        return {}
    out: dict[str, list[SplitOption]] = {}
    for t in stats:
        if t.sequence or t.feature_processed:
            continue
        opts: list[SplitOption] = []
        if hot and t.name in hot:
            opts += hot_cold_options(t, hot[t.name])
        elif hottest and t.name in hottest:
            opts += hot_cold_from_zipf(t, hottest[t.name])
        opts += row_range_options(t, world, (hot or {}).get(t.name))
        opts += column_slice_options(t, world)
        if opts:
            out[t.name] = [_tagged(o, i) for i, o in enumerate(opts)]
    return out


def options_of_plan(
    splits: Sequence[plans.Split], stats: Sequence[TableStats], hot: dict[str, HotIds] | None = None
) -> list[SplitOption]:
    """A plan's splits as the options the cost model prices, parts under the plan's names.

    A hot part's share of lookups is what the measured hot ids say of its rows (`hot`), else the
    table's skew curve for that many hottest rows (`TableStats.hot_share`).

    Raises:
        UserError: a split names a table without statistics.
    """
    by_name = {t.name: t for t in stats}
    out = []
    for s in splits:
        t = by_name.get(s.table)
        if t is None:
            raise UserError(f"split of table {s.table!r}: the table has no statistics")
        h = (hot or {}).get(s.table)
        if s.kind == "hot_cold":
            if h is not None and h.lookups > 0:
                hits = np.isin(h.ids, np.asarray(s.hot_ids, dtype=np.int64))
                share = int(h.counts[hits].sum()) / h.lookups
            else:
                share = t.hot_share(len(s.hot_ids) / t.num_embeddings)
            o = _hot_cold(t, s.hot_ids, share, s.parts)
        elif s.kind == "row_ranges":
            o = _row_ranges(t, s.ranges, s.parts, h)
        else:
            o = _column_slices(t, s.ranges, s.parts)
        out.append(dataclasses.replace(o, plan_names=s.parts))
    return out


def plan_tables(
    plan: plans.Plan, stats: Sequence[TableStats], hot: dict[str, HotIds] | None = None
) -> dict[str, TableStats]:
    """The tables a plan shards, by name, as the cost model prices them: `stats`, and the parts
    of the plan's splits (`options_of_plan`)."""
    parts = (q for o in options_of_plan(plan.splits, stats, hot) for q in o.parts)
    return {t.name: t for t in (*stats, *parts)}


def chosen_splits(
    options: dict[str, list[SplitOption]], choices: Mapping[str, object]
) -> list[SplitOption]:
    """The options `choices` take (it has their parts), in `options`' order."""
    return [o for opts in options.values() for o in opts if o.part_names[0] in choices]


def part_stats(options: dict[str, list[SplitOption]]) -> list[TableStats]:
    """Every option's parts, in `options`' order."""
    return [q for opts in options.values() for o in opts for q in o.parts]


def _tagged(o: SplitOption, i: int) -> SplitOption:
    """`o` with its parts named "<plan name>#i": unique among the options of one table."""
    parts = tuple(dataclasses.replace(q, name=f"{q.name}#{i}") for q in o.parts)
    return dataclasses.replace(o, parts=parts, plan_names=o.part_names)
